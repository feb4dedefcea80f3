"""Phases as spark-submit applications of a Spark standalone cluster on loopback: the
change feed is read, netted and merged by executors in the worker's JVMs, which load the
Delta jars the driver ships them; the MV is exact at every commit, also when a driver is
killed between an aggregate's two commits, and for an MV over that MV."""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path

import pytest
from deltalake import DeltaTable
from helpers_delta import mv_commits
from submit_process import spark_submit, submit_env

from airflow_backfill.engine.phases.snapshot import run_snapshot
from airflow_backfill.job import BackfillJob
from airflow_backfill.simulator import commit_epoch, create_orders_table
from oracle import assert_every_commit_matches

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def submit(cluster, phase: str, job: dict, parallelism: int, fault: str | None = None) -> subprocess.CompletedProcess:
    """Run `phase` as an application of `cluster`; `fault` arms a fault-injection point."""
    env = {key: value for key, value in os.environ.items() if key != "AIRFLOW_BACKFILL_FAULT"}
    if fault:
        env["AIRFLOW_BACKFILL_FAULT"] = fault
    # One executor with `parallelism` cores, as the operators size a phase (one JVM to start,
    # not one per core).
    options = ("--conf", f"spark.executor.cores={parallelism}", "--conf", f"spark.cores.max={parallelism}",
               "--conf", "spark.executor.memory=1g")
    command = spark_submit(phase, "--job-json", json.dumps(job), "--parallelism", str(parallelism),
                           master=cluster.master_url, options=options)
    return subprocess.run(command, capture_output=True, text=True, timeout=600, env=submit_env(env))


AGGREGATE_QUERY = (
    "SELECT customer_id, COUNT(*) AS orders, SUM(amount) AS revenue, MAX(quantity) AS top_quantity "
    "FROM source WHERE status <> 'cancelled' GROUP BY customer_id"
)
OVER_AGGREGATE_QUERY = "SELECT customer_id, orders, revenue FROM source WHERE orders >= 2"


def test_an_aggregate_killed_between_its_commits_on_the_cluster_recovers_and_feeds_an_mv(spark, tmp_path,
                                                                                          spark_cluster):
    """The aggregate's phases run on the worker's executors. The driver of its catch-up is
    killed after the per-group state commit and before the MV commit; the rerun brings the
    MV to the state's epoch first. A stateless MV over that aggregate MV, snapshotted before
    the crash (in the tests' session: one application less to start), then follows its
    change feed across the recovered commit on the cluster."""
    source, aggregate_mv, over_mv = (str(tmp_path / name) for name in ("orders", "by_customer", "regulars"))
    create_orders_table(source, rows=2000, seed=41)
    aggregate = {"name": "by_customer", "query": AGGREGATE_QUERY, "primary_key": ["order_id"], "lag_threshold": 0,
                 "backfill_parallelism": 2, "parallelism": 1, "source": source, "target": aggregate_mv}
    regulars = {"name": "regulars", "query": OVER_AGGREGATE_QUERY, "primary_key": ["customer_id"],
                "lag_threshold": 0, "backfill_parallelism": 2, "parallelism": 1, "source": aggregate_mv,
                "target": over_mv}
    created = submit(spark_cluster, "snapshot", aggregate, 2)
    assert created.returncode == 0, created.stderr[-3000:]
    run_snapshot(spark, BackfillJob(**regulars))
    rng = random.Random(42)
    for _ in range(3):
        commit_epoch(source, rng, inserts=20, updates=60, deletes=10)

    crashed = submit(spark_cluster, "catch_up", aggregate, 2, fault="catch_up:after_state_commit")
    assert crashed.returncode != 0 and "fault injection: killing" in crashed.stdout + crashed.stderr, \
        crashed.stderr[-3000:]
    rerun = submit(spark_cluster, "catch_up", aggregate, 2)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    recovered = [c for c in mv_commits(aggregate_mv) if c.get("airflow_backfill.recovered_from_state")]
    assert len(recovered) == 1, "the rerun did not bring the MV to the committed state's epoch first"
    caught_up = submit(spark_cluster, "catch_up", regulars, 2)
    assert caught_up.returncode == 0, caught_up.stderr[-3000:]

    applications = {app["name"]: app for app in spark_cluster.state()["completedapps"]}
    ran = {"airflow_backfill:by_customer:snapshot", "airflow_backfill:by_customer:catch_up",
           "airflow_backfill:regulars:catch_up"}
    assert ran <= applications.keys()
    assert all(applications[name]["cores"] >= 1 for name in ran), "a phase got no executor on the worker"
    assert_every_commit_matches(source, aggregate_mv, AGGREGATE_QUERY, "airflow_backfill/by_customer",
                                key=["customer_id"])
    assert_every_commit_matches(aggregate_mv, over_mv, OVER_AGGREGATE_QUERY, "airflow_backfill/regulars",
                                key=["customer_id"])
    phases = [c["airflow_backfill.phase"] for c in mv_commits(over_mv)]
    assert phases[0] == "snapshot" and set(phases[1:]) == {"catch_up"}, phases
    assert int(mv_commits(over_mv)[-1]["airflow_backfill.epoch"]) == DeltaTable(aggregate_mv).version()
