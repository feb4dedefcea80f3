"""The spark-submit entry points as separate processes, the way Airflow runs them, with
the upstream written by a simulator process the whole time."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from deltalake import DeltaTable
from submit_process import spark_submit, submit_env

from airflow_backfill.engine.launch.class_archive import archive_launch
from airflow_backfill.engine.phases.catch_up import run_catch_up
from airflow_backfill.engine.phases.forward import ForwardBounds, run_forward
from airflow_backfill.engine.phases.snapshot import SnapshotResult, run_snapshot
from airflow_backfill.job import load_job
from airflow_backfill.process import stop_driver
from oracle import assert_every_commit_matches

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
QUERY = "SELECT order_id, status, amount * quantity AS total FROM source WHERE quantity >= 2"


def start_simulator(table: str, seed: int, epoch_interval: float = 2) -> subprocess.Popen:
    command = [
        str(Path(sys.executable).with_name("airflow-backfill")), "simulate", "--table", table,
        "--rows", "2000", "--epoch-interval", str(epoch_interval), "--inserts", "20", "--updates", "30",
        "--deletes", "10", "--seed", str(seed),
    ]
    log = Path(table).parent / f"simulator-{seed}.log"  # a file: a pipe nobody reads fills and blocks it
    Path(table).parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, text=True)
    deadline = time.monotonic() + 60
    while not (Path(table) / "_delta_log").is_dir():
        assert process.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "simulator did not create the upstream"
        time.sleep(0.2)
    return process


def write_job(tmp_path: Path, tables: dict[str, str], lag_threshold: int = 1) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({
        "name": "orders_e2e", "query": QUERY, "primary_key": ["order_id"], **tables,
        "backfill_parallelism": 2, "parallelism": 1, "lag_threshold": lag_threshold, "poll_interval": 0.2,
    }))
    return path


def snapshot_in_process(spark, job: Path, **options) -> SnapshotResult:
    """The snapshot a test of a later phase starts from, made in the test session's own
    Spark (a spark-submit costs half a minute of start-up; the processes under test follow)."""
    return run_snapshot(spark, load_job(job), **options)


def rerun_in_process(spark, phase: str, job: Path) -> None:
    """The rerun after a killed spark-submit, in the test session's own Spark: recovery
    is the engine's, read from the tables the killed process left; only the kill needs
    a process of its own. Forward stops after two epochs or 30 s without one."""
    loaded = load_job(job)
    if phase == "snapshot":
        run_snapshot(spark, loaded)
    elif phase == "catch_up":
        run_catch_up(spark, loaded)
    else:
        run_forward(spark, loaded, bounds=ForwardBounds(max_epochs=2, idle_timeout=30))


def assert_delta_classes_came_from_the_archive(folder: Path) -> None:
    """The driver mapped Delta's classes from the JVM archive that scripts/test.sh builds
    (`airflow-backfill jvm-archive`), instead of loading them from the jars."""
    assert archive_launch() is not None, "no current JVM archive: run `airflow-backfill jvm-archive` (scripts/test.sh does)"
    driver_logs = [log.read_text() for log in folder.glob("classes-*.log") if "org.apache.spark.sql.delta." in log.read_text()]
    assert len(driver_logs) == 1
    # Classes the JVM generates at run time (lambdas, generated code) have other sources.
    from_files = [line for line in driver_logs[0].splitlines() if "source: shared objects file" in line
                  or "source: file:" in line or "source: jar:" in line]
    shared = [line for line in from_files if "source: shared objects file" in line]
    assert len(shared) > 0.8 * len(from_files), f"{len(shared)} of {len(from_files)} classes from the archive"
    assert any(" org.apache.spark.sql.delta." in line for line in shared)


def test_phases_as_spark_submit_processes(spark, tmp_path, tables):
    simulator = start_simulator(tables["source"], seed=5)
    job = write_job(tmp_path, tables)
    try:
        snapshot_in_process(spark, job)  # its entry point runs in the crash and DAG tests
        env = submit_env()
        # Each JVM (spark-submit's launcher, then the driver) logs where it found its classes.
        env["JAVA_TOOL_OPTIONS"] = f"{env.get('JAVA_TOOL_OPTIONS', '')} -Xlog:class+load=info:file={tmp_path}/classes-%p.log"
        done = subprocess.run(spark_submit("catch_up", "--job", str(job)), capture_output=True, text=True, timeout=600,
                              env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        assert_delta_classes_came_from_the_archive(tmp_path)
        forward = subprocess.Popen(
            spark_submit("forward", "--job", str(job)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=submit_env(),
        )
        start = DeltaTable(tables["target"]).transaction_version("airflow_backfill/orders_e2e")
        deadline = time.monotonic() + 120
        while DeltaTable(tables["target"]).transaction_version("airflow_backfill/orders_e2e") < start + 3:
            assert forward.poll() is None, forward.stdout.read()[-3000:] if forward.stdout else ""
            assert time.monotonic() < deadline, "forward did not advance the watermark"
            time.sleep(0.5)
        # What ForwardOperator.on_kill does: SIGTERM to the Python driver under spark-submit.
        assert stop_driver(forward.pid, "forward.py", timeout=120)
        output, _ = forward.communicate(timeout=10)
        assert forward.returncode == 0, output[-3000:]
        assert "stopping after the current commit" in output
    finally:
        simulator.send_signal(signal.SIGTERM)
        simulator.wait(timeout=60)
    assert simulator.returncode == 0
    assert_every_commit_matches(tables["source"], tables["target"], QUERY, "airflow_backfill/orders_e2e", key=["order_id"])


def test_bad_job_file_fails_before_spark_work(tmp_path, tables):
    job = tmp_path / "job.yaml"
    job.write_text(f"name: x\nsource: {tables['source']}\ntarget: {tables['target']}\nquery: SELECT 1\n")
    done = subprocess.run(spark_submit("snapshot", "--job", str(job)), capture_output=True, text=True, timeout=600,
                          env=submit_env())
    assert done.returncode == 2
    assert "missing required field(s) primary_key" in done.stdout
    assert not Path(tables["target"]).exists()
