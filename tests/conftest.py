"""Shared fixtures: one local SparkSession for the whole test session (JVM start-up
costs seconds), and per-test Delta table locations."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# spark-submit processes the tests start load Delta's jars at launch from here.
os.environ.setdefault("SPARK_CONF_DIR", str(ROOT / "jars" / "conf"))
# py4j logs at interpreter exit, after pytest closed the captured streams.
logging.getLogger("py4j").setLevel(logging.WARNING)


@pytest.fixture(scope="session")
def spark():
    from airflow_backfill.engine.spark_session import build_spark_session

    session = build_spark_session("airflow_backfill-tests", parallelism=2)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory):
    """A Spark standalone master and worker on 127.0.0.1 for the whole test session."""
    from spark_cluster import spark_cluster as start_cluster

    with start_cluster(tmp_path_factory.mktemp("spark-cluster")) as cluster:
        yield cluster


@pytest.fixture
def tables(tmp_path: Path) -> dict[str, str]:
    """Paths for an upstream and its MV inside the test's temporary directory."""
    return {"source": str(tmp_path / "orders"), "target": str(tmp_path / "orders_mv")}


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
