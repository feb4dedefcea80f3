"""Catch-up as a spark-submit application of a Spark standalone cluster on loopback: the
change feed is read, netted and merged by executors in the worker's JVMs, which load the
Delta jars the driver ships them; the MV is exact at every commit."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from helpers_delta import mv_commits

from airflow_backfill.simulator import commit_epoch, create_orders_table
from oracle import assert_every_commit_matches

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
QUERY = "SELECT order_id, customer_id, status, amount * quantity AS total FROM source WHERE quantity >= 2"


def submit(cluster, phase: str, job: dict, parallelism: int) -> subprocess.CompletedProcess:
    command = [
        str(Path(sys.executable).with_name("spark-submit")), "--master", cluster.master_url,
        "--conf", "spark.executor.cores=1", "--conf", f"spark.cores.max={parallelism}",
        "--conf", "spark.executor.memory=1g",
        str(ROOT / "spark_jobs" / f"{phase}.py"), "--job-json", json.dumps(job), "--parallelism", str(parallelism),
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


def test_catch_up_runs_on_the_cluster_executors(tables, spark_cluster):
    create_orders_table(tables["source"], rows=2000, seed=31)
    job = {"name": "on_cluster", "query": QUERY, "primary_key": ["order_id"], "lag_threshold": 0,
           "backfill_parallelism": 2, "parallelism": 1, **tables}
    snapshot = submit(spark_cluster, "snapshot", job, 2)
    assert snapshot.returncode == 0, snapshot.stderr[-3000:]
    rng = random.Random(32)
    for _ in range(4):
        commit_epoch(tables["source"], rng, inserts=20, updates=60, deletes=10)
    caught_up = submit(spark_cluster, "catch_up", job, 2)
    assert caught_up.returncode == 0, caught_up.stderr[-3000:]

    applications = {app["name"]: app for app in spark_cluster.state()["completedapps"]}
    assert {"airflow_backfill:on_cluster:snapshot", "airflow_backfill:on_cluster:catch_up"} <= applications.keys()
    assert applications["airflow_backfill:on_cluster:catch_up"]["cores"] >= 1  # it got executors on the worker
    commits = mv_commits(tables["target"])
    assert [c["airflow_backfill.phase"] for c in commits] == ["snapshot", "catch_up"]
    assert int(commits[-1]["airflow_backfill.epoch"]) == 4
    assert_every_commit_matches(tables["source"], tables["target"], QUERY, "airflow_backfill/on_cluster",
                                key=["order_id"])
