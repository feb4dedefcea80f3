"""Maintenance compacts the MV and purges its deletion vectors without changing its rows,
its watermark or its change feed, and catch-up continues from it afterwards."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from helpers_delta import change_feed

from airflow_backfill.cli import main
from airflow_backfill.engine.maintenance import maintain_mv
from airflow_backfill.engine.phases.catch_up import run_catch_up
from airflow_backfill.engine.phases.snapshot import run_snapshot
from airflow_backfill.engine.writer_lock import writer_lock
from airflow_backfill.exceptions import TargetError
from airflow_backfill.job import BackfillJob
from airflow_backfill.simulator import commit_epoch, create_orders_table
from oracle import assert_every_commit_matches

pytestmark = pytest.mark.spark

QUERY = "SELECT order_id, customer_id, amount FROM source WHERE status <> 'cancelled'"


def test_maintenance_compacts_and_purges_without_changing_the_mv(spark, tables):
    create_orders_table(tables["source"], rows=600, seed=21)
    # MERGE rounds, which mark rows in deletion vectors (the small MV would otherwise be overwritten)
    job = BackfillJob(name="kept", query=QUERY, primary_key=["order_id"], lag_threshold=0, round_plan="merge",
                      **tables)
    run_snapshot(spark, job, chunk_bytes=1)
    rng = random.Random(22)
    for _ in range(3):
        commit_epoch(tables["source"], rng, inserts=10, updates=40, deletes=10)
        run_catch_up(spark, job)
    before = DeltaTable(job.target)
    watermark = before.transaction_version(job.app_id)
    assert pa.table(before.deletion_vectors()).num_rows > 0

    result = maintain_mv(spark, job)

    after = DeltaTable(job.target)
    assert result.files_after < result.files_before
    assert after.transaction_version(job.app_id) == watermark
    assert pa.table(after.deletion_vectors()).num_rows == 0
    for version in range(before.version() + 1, after.version() + 1):
        assert change_feed(job.target, version).num_rows == 0, "maintenance showed up as data changes"
    commit_epoch(tables["source"], rng, inserts=5, updates=5, deletes=5)
    run_catch_up(spark, job)
    assert_every_commit_matches(job.source, job.target, QUERY, job.app_id, key=["order_id"])


def test_a_smaller_file_size_keeps_the_mv_in_files_of_separate_key_ranges(spark, tables):
    create_orders_table(tables["source"], rows=3000, seed=24)
    job = BackfillJob(name="sized", query=QUERY, primary_key=["order_id"], **tables)
    run_snapshot(spark, job, chunk_bytes=1)
    size = sum(pa.table(DeltaTable(job.target).get_add_actions(flatten=True)).column("size_bytes").to_pylist())

    result = maintain_mv(spark, job, max_file_size=size // 4)

    files = pa.table(DeltaTable(job.target).get_add_actions(flatten=True))
    lows, highs = files.column("min.order_id").to_pylist(), files.column("max.order_id").to_pylist()
    ranges = sorted(zip(lows, highs, strict=True))
    assert result.files_after == len(ranges) >= 3
    # ZORDER BY one column range-partitions on sampled bounds: neighbours may share a few keys
    overlap = sum(max(0, high - low + 1) for (_, high), (low, _) in zip(ranges, ranges[1:], strict=False))
    assert overlap <= 0.02 * (ranges[-1][1] - ranges[0][0]), f"files overlap in key ranges: {ranges}"
    assert spark.conf.get("spark.databricks.delta.optimize.maxFileSize", None) is None, "the size leaked"
    assert_every_commit_matches(job.source, job.target, QUERY, job.app_id, key=["order_id"])


def test_maintenance_waits_for_no_writer(spark, tables):
    create_orders_table(tables["source"], rows=50, seed=23)
    job = BackfillJob(name="busy", query=QUERY, primary_key=["order_id"], **tables)
    run_snapshot(spark, job)
    with writer_lock(job.target, job.name, "forward"):
        with pytest.raises(TargetError, match="another run of job busy is writing the MV"):
            maintain_mv(spark, job)


def test_the_maintain_command_refuses_a_missing_job_file(tmp_path, capsys):
    assert main(["maintain", "--job", str(tmp_path / "missing.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err
