"""Shared fixtures: one local SparkSession for the whole test session (JVM start-up
costs seconds), and per-test Delta table locations."""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
TEST_SPARK_SETTINGS = {
    # Test tables hold hundreds of rows: compiling generated Java code for every new plan
    # (and the JIT compiling it again) costs more than it saves, about a third of a round.
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    "spark.ui.enabled": "false",
}


# The settings a phase runs with (jars/conf, or the folder the environment names), kept
# for the tests that run the engine as deployed (the differential harness under Kolkata);
# test processes started by this one inherit it.
os.environ.setdefault("INSTALLED_SPARK_CONF_DIR", os.environ.get("SPARK_CONF_DIR", str(ROOT / "jars" / "conf")))


def _test_spark_conf_dir() -> str:
    """Delta's launch settings plus the test-only settings above, for the test session and
    every spark-submit a test starts."""
    installed = Path(os.environ["INSTALLED_SPARK_CONF_DIR"]) / "spark-defaults.conf"
    folder = Path(tempfile.mkdtemp(prefix="airflow_backfill-spark-conf-"))
    lines = [installed.read_text().rstrip("\n")] if installed.exists() else []
    lines += [f"{key} {value}" for key, value in TEST_SPARK_SETTINGS.items()]
    (folder / "spark-defaults.conf").write_text("\n".join(lines) + "\n")
    atexit.register(shutil.rmtree, folder, True)
    return str(folder)


os.environ["SPARK_CONF_DIR"] = _test_spark_conf_dir()
# The JVMs tests start (spark-submit's, the cluster's, the S3 server's and the broker's)
# live seconds to minutes over small data: the optimising JIT compiler and parallel GC
# threads would mostly compete with the other test process for the two cores. The quick
# compiler alone and the serial GC take about 40 % less CPU. The shared session keeps the
# optimising compiler (`_full_jit`).
QUICK_JIT = "-XX:TieredStopAtLevel=1"
os.environ.setdefault("JAVA_TOOL_OPTIONS", f"{QUICK_JIT} -XX:+UseSerialGC")
# py4j logs at interpreter exit, after pytest closed the captured streams.
logging.getLogger("py4j").setLevel(logging.WARNING)


LONGEST_MODULES = (
    "test_differential.py", "test_bench_smoke.py", "test_dag_run.py", "test_tpch_dag.py", "test_object_store_dag.py",
    "test_spark_cluster.py", "test_tpch_q3_dag.py", "test_many_mvs_postgres.py",
)
"""Modules whose tests take minutes each (see the `--durations` report of scripts/test.sh)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest tests first, then the other end-to-end tests: the suite runs on two
    processes that take the next test as they finish one (scripts/test.sh), and a
    minutes-long test started last would run alone at the end."""
    items.sort(key=lambda item: (item.path.name not in LONGEST_MODULES, item.get_closest_marker("e2e") is None))


@contextmanager
def _full_jit() -> Iterator[None]:
    """JVMs started in the block get the optimising JIT compiler: the shared session runs
    for the whole test session and most tests' Spark jobs, where it pays off (with Spark's
    code generation off, expressions are interpreted: the aggregate, keyed-write, join,
    MV-on-MV and round-plan tests took 333 s in one process, 551 s with the quick compiler
    alone, 2026-12-04)."""
    quick = os.environ.get("JAVA_TOOL_OPTIONS")
    if quick is not None:
        os.environ["JAVA_TOOL_OPTIONS"] = quick.replace(QUICK_JIT, "").strip()
    try:
        yield
    finally:
        if quick is not None:
            os.environ["JAVA_TOOL_OPTIONS"] = quick


@pytest.fixture(scope="session")
def spark():
    from airflow_backfill.engine.spark_session import build_spark_session

    with _full_jit():
        session = build_spark_session("airflow_backfill-tests", parallelism=2)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory):
    """A Spark standalone master and worker on 127.0.0.1 for the whole test session."""
    from spark_cluster import spark_cluster as start_cluster

    with start_cluster(tmp_path_factory.mktemp("spark-cluster")) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    """An S3-compatible server on 127.0.0.1 for the whole test session."""
    from airflow_backfill.storage.loopback_s3 import loopback_s3

    with loopback_s3(tmp_path_factory.mktemp("s3-server")) as server:
        yield server


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL server on 127.0.0.1 for the whole test session (Airflow's metadata
    database in the many-MV end-to-end test)."""
    from postgres import postgres_server

    with postgres_server() as server:
        yield server


@pytest.fixture
def s3_tables(s3, spark, monkeypatch) -> dict[str, str]:
    """An upstream and MV location in a fresh bucket; this process (engine, delta-rs, the
    oracle) and the shared Spark session reach the server through its settings."""
    from airflow_backfill.engine.spark_s3 import configure_s3a

    for variable, value in s3.settings().environment().items():
        monkeypatch.setenv(variable, value)
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    configure_s3a(spark, s3.settings())
    bucket = s3.new_bucket()
    return {"source": f"s3://{bucket}/lake/orders", "target": f"s3://{bucket}/lake/orders_mv"}


@pytest.fixture
def tables(tmp_path: Path) -> dict[str, str]:
    """Paths for an upstream and its MV inside the test's temporary directory."""
    return {"source": str(tmp_path / "orders"), "target": str(tmp_path / "orders_mv")}


@pytest.fixture(autouse=True)
def warm_round_plans():
    """Every plan counts as run in this process, as it is in the shared Spark session after a
    few tests: a test's round plans must not depend on which tests ran before it. Tests of
    a fresh process's first rounds call `warmth.forget()`."""
    from airflow_backfill.engine.planning.round_plan import FIRST_USE_S, RoundPlan
    from airflow_backfill.engine.rounds import warmth

    for plan in FIRST_USE_S:
        warmth.mark_run(RoundPlan(plan, {}, "the test session's JVM"))
    yield


@pytest.fixture(autouse=True)
def restore_root_logging():
    """Commands run in-process (`cli.main`) configure the root logger with the stream
    pytest captured for that test; later tests must not log to it once it is closed."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in root.handlers:
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


from kafka_fixtures import kafka_broker, kafka_simulator  # noqa: E402,F401  (Kafka tests' fixtures)

