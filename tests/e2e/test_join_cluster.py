"""A join's catch-up as an application of the loopback Spark standalone cluster: the
change feeds of three upstreams are read, joined and merged by executors in the worker's
JVMs (the snapshot is made in the test's own Spark, which only saves a start-up)."""

from __future__ import annotations

import random

import pytest
from join_upstreams import create_all, random_epoch, sources
from test_spark_cluster import submit

from airflow_backfill.engine.phases.snapshot import run_snapshot
from airflow_backfill.job import BackfillJob
from oracle import assert_every_join_commit_matches

pytestmark = pytest.mark.e2e

QUERY = ("SELECT i.i_order, i.i_line, i.i_qty, o.o_day, c.c_segment FROM items i JOIN orders o "
         "ON i.i_order = o.o_id LEFT JOIN customer c ON c.c_id = o.o_cust")


def test_a_join_catches_up_on_the_cluster(spark, tmp_path, spark_cluster):
    tables = create_all(str(tmp_path), seed=51)
    job = {"name": "joined_cluster", "target": str(tmp_path / "mv"), "query": QUERY, "sources": sources(tables),
           "lag_threshold": 0, "backfill_parallelism": 2, "parallelism": 1, "round_plan": "incremental"}
    run_snapshot(spark, BackfillJob.from_mapping(job))
    rng = random.Random(51)
    for table in tables.values():
        random_epoch(table, rng)
        random_epoch(table, rng)
    caught_up = submit(spark_cluster, "catch_up", job, 2)
    assert caught_up.returncode == 0, caught_up.stderr[-3000:]
    applications = {app["name"] for app in spark_cluster.state()["completedapps"]}
    assert "airflow_backfill:joined_cluster:catch_up" in applications
    vectors = assert_every_join_commit_matches({n: t.uri for n, t in tables.items()}, job["target"], QUERY,
                                               "airflow_backfill/joined_cluster", key=["i_order", "i_line"])
    assert vectors == [{"customer": 0, "orders": 0, "items": 0}, {"customer": 2, "orders": 2, "items": 2}]
