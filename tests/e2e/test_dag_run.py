"""`airflow dags test example_orders_mv` against a Spark standalone cluster on loopback and
an upstream a simulator keeps writing: every phase runs as an application of the cluster
(executors in the worker's JVMs, the Delta jars shipped to them by the driver), and the MV
equals the query recomputed independently at its watermark after every commit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from deltalake import DeltaTable
from helpers_delta import mv_commits
from test_spark_submit import start_simulator

from airflow_backfill.job import load_job
from oracle import assert_every_commit_matches

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def airflow(*args: str, env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess:
    binary = str(Path(sys.executable).with_name("airflow"))
    return subprocess.run([binary, *args], env=env, capture_output=True, text=True, timeout=timeout)


def test_dags_test_backfills_a_live_upstream_on_a_spark_cluster(tmp_path, spark_cluster):
    env = {**os.environ, "AIRFLOW_BACKFILL_HOME": str(tmp_path / "tables"),
           "AIRFLOW_HOME": str(tmp_path / "airflow"), "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
           "AIRFLOW_CONN_SPARK_DEFAULT": f"{spark_cluster.master_url}?deploy-mode=client"}
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
        run = airflow("dags", "test", "example_orders_mv", "--conf",
                      '{"forward_max_epochs": 2, "forward_idle_timeout": 10}', env=env)
        output = run.stdout + run.stderr
        assert run.returncode == 0, output[-5000:]
        assert simulator.poll() is None, "the upstream stopped during the run"
    finally:
        simulator.send_signal(signal.SIGTERM)
        simulator.wait(timeout=60)
    for task in ("pin_epoch", "snapshot", "catch_up", "wait_caught_up", "forward"):
        assert f"orders_mv.{task}" in output
    assert "snapshot done" in output and "catch-up done" in output and "forward stopped" in output
    # The operators sized the cluster applications: executors x cores from each phase's parallelism.
    assert "--conf spark.executor.cores=2" in output and "--conf spark.executor.cores=1" in output
    names = " ".join(app["name"] for app in spark_cluster.state().get("completedapps", []))
    for phase in ("snapshot", "catch_up", "forward"):
        assert f"orders_mv:{phase}" in names, f"the {phase} phase did not run on the cluster: {names}"
    watermark = DeltaTable(job.target).transaction_version(job.app_id)
    assert watermark is not None and watermark >= started_from
    checked = assert_every_commit_matches(job.source, job.target, job.query, job.app_id, key=list(job.primary_key))
    assert checked >= 3  # snapshot, at least one catch-up round, at least one forward commit
    assert {c["airflow_backfill.phase"] for c in mv_commits(job.target)} >= {"snapshot", "catch_up", "forward"}
