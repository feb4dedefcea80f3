"""`airflow dags test example_orders_mv` against an upstream a simulator keeps writing:
the MV then equals the query recomputed independently at its watermark, after every
commit, and the watermark is at least the upstream version the run started from."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from deltalake import DeltaTable
from test_spark_submit import start_simulator

from airflow_backfill.job import load_job
from oracle import assert_every_commit_matches

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def airflow(*args: str, env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess:
    binary = str(Path(sys.executable).with_name("airflow"))
    return subprocess.run([binary, *args], env=env, capture_output=True, text=True, timeout=timeout)


def test_dags_test_backfills_a_live_upstream(tmp_path):
    env = {**os.environ, "AIRFLOW_BACKFILL_HOME": str(tmp_path / "tables"),
           "AIRFLOW_HOME": str(tmp_path / "airflow"), "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags")}
    migrated = airflow("db", "migrate", env=env)
    assert migrated.returncode == 0, migrated.stderr[-3000:]
    os.environ["AIRFLOW_BACKFILL_HOME"] = env["AIRFLOW_BACKFILL_HOME"]
    try:
        job = load_job(ROOT / "jobs" / "orders_mv.yaml")
    finally:
        del os.environ["AIRFLOW_BACKFILL_HOME"]
    simulator = start_simulator(job.source, seed=11)
    try:
        started_from = DeltaTable(job.source).version()
        run = airflow("dags", "test", "example_orders_mv", env=env)
        output = run.stdout + run.stderr
        assert run.returncode == 0, output[-5000:]
        assert simulator.poll() is None, "the upstream stopped during the run"
    finally:
        simulator.send_signal(signal.SIGTERM)
        simulator.wait(timeout=60)
    for task in ("pin_epoch", "snapshot", "catch_up", "wait_caught_up", "forward"):
        assert f"orders_mv.{task}" in output
    assert "snapshot done" in output and "catch-up done" in output and "forward stopped" in output
    watermark = DeltaTable(job.target).transaction_version(job.app_id)
    assert watermark is not None and watermark >= started_from
    checked = assert_every_commit_matches(job.source, job.target, job.query, job.app_id, key=list(job.primary_key))
    assert checked >= 3  # snapshot, at least one catch-up round, at least one forward commit
