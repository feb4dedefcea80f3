"""The MV records which readers read its change feed exactly under its round plan: created
with the table property, changed by a metadata commit when a run's `round_plan` reads
otherwise, shown by `status`; delta-rs reads the tables it is set on, and every data
commit still equals the query at its watermark."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from deltalake import DeltaTable

from airflow_backfill.engine.feed_readers import (
    DELTA_RS_READER,
    FEED_READERS_PROPERTY,
    SPARK_READER,
    feed_reader_properties,
    feed_readers,
    recorded_feed_readers,
)
from airflow_backfill.engine.phases.catch_up import run_catch_up
from airflow_backfill.engine.phases.snapshot import run_snapshot
from airflow_backfill.engine.planning.round_plan import ROUND_PLAN_CHOICES
from airflow_backfill.engine.status import format_status, job_status
from airflow_backfill.job import BackfillJob
from airflow_backfill.simulator import commit_epoch, create_orders_table
from oracle import assert_every_commit_matches

STATELESS = "SELECT order_id, customer_id, status, amount FROM source WHERE status <> 'cancelled'"
AGGREGATE = "SELECT customer_id, COUNT(*) AS n, SUM(amount) AS total FROM source GROUP BY customer_id"


def test_only_merge_keeps_the_feed_exact_for_delta_rs():
    assert {plan: feed_readers(plan) for plan in ROUND_PLAN_CHOICES} == {
        "auto": (SPARK_READER,), "incremental": (SPARK_READER,), "recompute": (SPARK_READER,),
        "merge": (SPARK_READER, DELTA_RS_READER),
    }
    job = BackfillJob(name="j", source="/tmp/s", target="/tmp/t", query="SELECT id FROM source",
                      primary_key=["id"], round_plan="merge")
    assert feed_reader_properties(job) == {FEED_READERS_PROPERTY: "delta-spark,delta-rs"}
    assert recorded_feed_readers("/tmp/no-such-table-for-feed-readers") is None


def operations(uri: str) -> list[str]:
    return [entry["operation"] for entry in sorted(DeltaTable(uri).history(), key=lambda entry: entry["version"])]


@pytest.mark.spark
@pytest.mark.parametrize("query", [STATELESS, AGGREGATE], ids=["stateless", "aggregate"])
def test_the_mv_records_its_feed_readers_and_follows_its_round_plan(spark, tables, query):
    create_orders_table(tables["source"], rows=300, seed=21)
    job = BackfillJob(name="feed_readers", query=query, primary_key=["order_id"],
                      lag_threshold=0, backfill_parallelism=1, parallelism=1, **tables)
    run_snapshot(spark, job)
    assert recorded_feed_readers(job.target) == ["delta-spark"]  # created with it: no commit of its own
    assert "SET TBLPROPERTIES" not in operations(job.target)
    assert "delta-spark" in format_status(job_status(job))

    rng = random.Random(22)
    merged = replace(job, round_plan="merge")  # e.g. a dag_run.conf override for one run
    commit_epoch(tables["source"], rng, inserts=5, updates=10, deletes=3)
    run_catch_up(spark, merged)
    assert recorded_feed_readers(job.target) == ["delta-spark", "delta-rs"]
    assert job_status(merged).feed_readers == ["delta-spark", "delta-rs"]
    assert operations(job.target).count("SET TBLPROPERTIES") == 1
    commit_epoch(tables["source"], rng, inserts=5, updates=10, deletes=3)
    run_catch_up(spark, merged)  # the same plan: nothing to change
    assert operations(job.target).count("SET TBLPROPERTIES") == 1

    commit_epoch(tables["source"], rng, inserts=5, updates=10, deletes=3)
    run_catch_up(spark, job)  # back under auto
    assert recorded_feed_readers(job.target) == ["delta-spark"]
    assert operations(job.target).count("SET TBLPROPERTIES") == 2
    if query == STATELESS:  # every data commit, the metadata ones between them included
        assert_every_commit_matches(tables["source"], job.target, query, job.app_id, key=["order_id"])
