"""The upstream must keep what catch-up needs: vacuumed change files, an expired log or a
changed schema stop catch-up with an error that says how to recover, and the MV is left
untouched. Short retention settings are flagged before a backfill starts."""

from __future__ import annotations

import os
import random
from datetime import timedelta

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from airflow_backfill.engine.delta.retention import (
    margin_warnings,
    parse_interval,
    retention_warnings,
    upstream_retention,
)
from airflow_backfill.engine.phases.catch_up import run_catch_up
from airflow_backfill.engine.phases.snapshot import run_snapshot
from airflow_backfill.exceptions import UpstreamError
from airflow_backfill.job import BackfillJob
from airflow_backfill.simulator import commit_epoch, create_orders_table
from oracle import assert_mv_matches

pytestmark = pytest.mark.spark

QUERY = "SELECT order_id, status, amount FROM source WHERE quantity > 1"


def snapshotted(spark, tables) -> BackfillJob:
    create_orders_table(tables["source"], rows=300, seed=3)
    job = BackfillJob(name="guarded", query=QUERY, primary_key=["order_id"], **tables)
    run_snapshot(spark, job)
    rng = random.Random(3)
    for _ in range(3):
        commit_epoch(tables["source"], rng, inserts=5, updates=10, deletes=3)
    return job


def vacuum_now(source: str, *, change_files: bool) -> None:
    """VACUUM with zero retention; Delta Lake's Spark VACUUM also deletes `_change_data`
    files, delta-rs' keeps them, so both are exercised."""
    removed = DeltaTable(source).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    assert removed, "the vacuum removed nothing; the test would prove nothing"
    if change_files:
        change_dir = os.path.join(source, "_change_data")
        for name in os.listdir(change_dir):
            os.remove(os.path.join(change_dir, name))


def test_vacuum_that_keeps_change_files_loses_nothing(spark, tables):
    job = snapshotted(spark, tables)
    vacuum_now(job.source, change_files=False)
    result = run_catch_up(spark, job)
    assert result.watermark == DeltaTable(job.source).version()
    assert_mv_matches(job.source, job.target, QUERY, job.app_id, key=["order_id"])


def test_vacuumed_change_files_stop_catch_up_and_leave_the_mv(spark, tables):
    job = snapshotted(spark, tables)
    mv_version = DeltaTable(job.target).version()
    vacuum_now(job.source, change_files=True)
    with pytest.raises(UpstreamError, match=r"change files for version 1 are gone .*vacuumed past the MV's "
                                            r"watermark 0.*rebuild the MV with a new snapshot"):
        run_catch_up(spark, job)
    assert DeltaTable(job.target).version() == mv_version


def test_expired_log_entries_stop_catch_up(spark, tables):
    job = snapshotted(spark, tables)  # MV at 0, upstream at 3
    mv_version = DeltaTable(job.target).version()
    DeltaTable(job.source).create_checkpoint()  # what log cleanup keeps: a checkpoint at 3 ...
    for version in range(3):  # ... and no commit files before it
        os.remove(os.path.join(job.source, "_delta_log", f"{version:020d}.json"))
    with pytest.raises(UpstreamError, match=r"no longer has version\(s\) 1\.\.2 .*log expired"):
        run_catch_up(spark, job)
    assert DeltaTable(job.target).version() == mv_version


def test_intervals_parse_like_delta():
    assert parse_interval("interval 7 days") == timedelta(days=7)
    assert parse_interval("interval 1 hour") == timedelta(hours=1)
    assert parse_interval("30 minutes") == timedelta(minutes=30)
    assert parse_interval("soon") is None


def test_short_retention_is_flagged_before_a_backfill(tables):
    create_orders_table(tables["source"], rows=50, seed=1)
    DeltaTable(tables["source"]).alter.set_table_properties(
        {"delta.deletedFileRetentionDuration": "interval 10 minutes"}
    )
    assert upstream_retention(tables["source"]).deleted_files == timedelta(minutes=10)
    warnings = retention_warnings(tables["source"], parallelism=2)
    assert len(warnings) == 1
    assert "delta.deletedFileRetentionDuration is 0:10:00, shorter than this backfill may take" in warnings[0]


def test_default_retention_is_not_flagged(tables):
    create_orders_table(tables["source"], rows=50, seed=1)
    assert retention_warnings(tables["source"], parallelism=1) == []


def test_changes_older_than_half_the_retention_are_flagged(tables):
    create_orders_table(tables["source"], rows=50, seed=1)
    commit_epoch(tables["source"], random.Random(1), inserts=1, updates=1, deletes=0)
    later = DeltaTable(tables["source"]).history(limit=1)[0]["timestamp"] / 1000
    assert margin_warnings(tables["source"], 0, now=later + 60) == []
    flagged = margin_warnings(tables["source"], 0, now=later + 4 * 24 * 3600)
    assert len(flagged) == 1 and "past half of the upstream's retention (7 days, 0:00:00)" in flagged[0]


def test_upstream_schema_change_stops_catch_up_and_leaves_the_mv(spark, tables):
    job = snapshotted(spark, tables)
    mv_version = DeltaTable(job.target).version()
    current = DeltaTable(job.source).to_pyarrow_table().slice(0, 1)
    widened = current.append_column("discount", pa.array([0.5]))
    write_deltalake(job.source, widened, mode="append", schema_mode="merge")
    with pytest.raises(UpstreamError, match=r"schema changed between version 0 \(the MV's watermark\) and 4: "
                                            r"added discount\. The MV was left untouched"):
        run_catch_up(spark, job)
    assert DeltaTable(job.target).version() == mv_version
