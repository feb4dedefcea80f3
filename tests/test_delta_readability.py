"""Tables written by delta-spark stay readable by delta-rs (the Airflow side's reader): every
MV and aggregate state, its rows and its change feed, equal to what Spark reads; only
reader features delta-rs supports; and the MV's feed holds only the real per-key changes."""

from __future__ import annotations

import json
import random
from collections import Counter

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from helpers_delta import change_feed, cycle_write_ways, mv_commits

from airflow_backfill.engine.aggregates.state import state_uri
from airflow_backfill.engine.delta.log import CHECKPOINT_INTERVAL_PROPERTY
from airflow_backfill.engine.phases.catch_up import run_catch_up
from airflow_backfill.engine.phases.snapshot import run_snapshot
from airflow_backfill.job import BackfillJob
from airflow_backfill.simulator import commit_epoch, create_orders_table
from oracle import table_rows

pytestmark = pytest.mark.spark

STATELESS = "SELECT order_id, customer_id, status, amount FROM source WHERE status <> 'cancelled'"
AGGREGATE = "SELECT customer_id, COUNT(*) AS n, SUM(amount) AS total, MAX(amount) AS top FROM source GROUP BY customer_id"
READABLE_FEATURES = {"deletionVectors"}


def spark_rows(spark, uri: str, version: int) -> Counter:
    frame = spark.read.format("delta").option("versionAsOf", version).load(uri)
    return Counter(tuple(row) for row in frame.collect())


def rs_rows(uri: str, version: int) -> Counter:
    return Counter(tuple(row.values()) for row in table_rows(uri, version).to_pylist())


def spark_feed(spark, uri: str, version: int) -> Counter:
    frame = (spark.read.format("delta").option("readChangeFeed", "true")
             .option("startingVersion", version).option("endingVersion", version).load(uri)
             .drop("_commit_version", "_commit_timestamp"))
    return Counter(tuple(row) for row in frame.collect())


def rs_feed(uri: str, version: int) -> Counter:
    feed = change_feed(uri, version).drop_columns(["_commit_version", "_commit_timestamp"])
    columns = [c for c in feed.column_names if c != "_change_type"] + ["_change_type"]
    return Counter(tuple(row.values()) for row in feed.select(columns).to_pylist())


def build(spark, tables: dict[str, str], query: str, primary_key: list[str], monkeypatch,
          ways: tuple[str, ...] | None = ("merge",), round_plan: str = "incremental") -> BackfillJob:
    """The job after a snapshot and two catch-up rounds written the `ways` given in turn (the
    tiny tables would otherwise be overwritten whole), or as `round_plan` chooses."""
    if ways:
        cycle_write_ways(monkeypatch, ways)
    create_orders_table(tables["source"], rows=400, seed=11)
    job = BackfillJob(name="readable", query=query, primary_key=primary_key, lag_threshold=0,
                      backfill_parallelism=2, parallelism=1, round_plan=round_plan, **tables)
    run_snapshot(spark, job)
    rng = random.Random(12)
    for _ in range(2):  # two rounds of updates and deletes: deletion vectors and change files
        for _ in range(3):
            commit_epoch(tables["source"], rng, inserts=10, updates=30, deletes=8)
        run_catch_up(spark, job)
    return job


@pytest.mark.parametrize("query", [STATELESS, AGGREGATE], ids=["stateless", "aggregate"])
def test_delta_rs_reads_every_version_as_spark_does_whatever_the_way(spark, tables, monkeypatch, query):
    job = build(spark, tables, query, ["order_id"], monkeypatch, ("merge", "replace", "delete", "overwrite"))
    for uri in [job.target] + ([state_uri(job.target)] if query == AGGREGATE else []):
        table = DeltaTable(uri)
        assert set(table.protocol().reader_features or []) <= READABLE_FEATURES
        assert table.protocol().min_reader_version <= 3
        # rewritten in part every round: Delta's checkpoint every 10 commits cost more than it saves
        assert table.metadata().configuration[CHECKPOINT_INTERVAL_PROPERTY] == "100"
        for version in range(table.version() + 1):
            assert rs_rows(uri, version) == spark_rows(spark, uri, version), f"{uri} rows at {version}"


@pytest.mark.parametrize("query", [STATELESS, AGGREGATE], ids=["stateless", "aggregate"])
def test_under_round_plan_merge_delta_rs_reads_the_mv_feed_as_spark_does(spark, tables, monkeypatch, query):
    """A replace, a delete or an overwrite of files with deletion vectors leaves the feed to
    be derived from the vectors, which delta-rs 1.6 does not do; `round_plan: merge` keeps
    to the ways whose feed it reads (docs/round-plans.md)."""
    job = build(spark, tables, query, ["order_id"], monkeypatch, ways=None, round_plan="merge")
    plans = [json.loads(commit["airflow_backfill.plan"]) for commit in mv_commits(job.target)
             if "airflow_backfill.plan" in commit]
    assert plans and all(plan.get("writes", {}).get("mv", plan["plan"]) in ("merge", "append", "patch") for plan in plans)
    for version in range(1, DeltaTable(job.target).version() + 1):
        assert rs_feed(job.target, version) == spark_feed(spark, job.target, version), f"feed at {version}"


def test_mv_merges_mark_rows_with_deletion_vectors(spark, tables, monkeypatch):
    job = build(spark, tables, STATELESS, ["order_id"], monkeypatch)
    vectors = pa.table(DeltaTable(job.target).deletion_vectors())
    assert vectors.num_rows > 0, "MERGE rewrote whole files instead of marking replaced rows"


def test_the_mv_feed_holds_only_the_keys_a_round_changed(spark, tables, monkeypatch):
    job = build(spark, tables, STATELESS, ["order_id"], monkeypatch)
    rng = random.Random(13)
    before = {row["order_id"]: row for row in table_rows(job.target).to_pylist()}
    commit_epoch(tables["source"], rng, inserts=3, updates=5, deletes=2)
    run_catch_up(spark, job)
    after = {row["order_id"]: row for row in table_rows(job.target).to_pylist()}
    changed = {key for key in before.keys() | after.keys() if before.get(key) != after.get(key)}

    feed = change_feed(job.target, DeltaTable(job.target).version())
    assert changed and set(feed.column("order_id").to_pylist()) == changed
    kinds = Counter(feed.column("_change_type").to_pylist())
    assert kinds["update_preimage"] == kinds["update_postimage"]
    assert sum(kinds.values()) == kinds["insert"] + kinds["delete"] + 2 * kinds["update_postimage"]
