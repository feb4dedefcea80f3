"""An upstream version whose data files VACUUM removed is refused before anything is read
or written: pinned by a person, it is an error that says what is gone and what to do; an
unfinished snapshot pinned there starts over at a version that is whole."""

from __future__ import annotations

import logging

import pytest
from deltalake import DeltaTable, write_deltalake

from airflow_backfill.engine.delta.log import read_watermark, table_exists
from airflow_backfill.engine.delta.vacuumed import check_not_vacuumed
from airflow_backfill.engine.phases.snapshot import run_snapshot
from airflow_backfill.engine.snapshot_chunks.progress import SnapshotProgress, save_progress
from airflow_backfill.exceptions import UpstreamError
from airflow_backfill.job import BackfillJob
from airflow_backfill.simulator import create_orders_table
from oracle import table_rows

QUERY = "SELECT order_id, status, amount FROM source"


def rewritten_and_vacuumed(uri: str) -> int:
    """Version 0 of `uri` (the simulator's orders) rewritten whole in version 1, then the
    files only version 0 referenced vacuumed; the latest version."""
    create_orders_table(uri, rows=50, seed=5)
    write_deltalake(uri, table_rows(uri, 0), mode="overwrite")
    check_not_vacuumed(uri, 0)  # rewritten, but every file still there: whole
    DeltaTable(uri).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    return DeltaTable(uri).version()


def test_a_vacuumed_version_is_refused_with_what_is_gone(tmp_path):
    uri = str(tmp_path / "orders")
    latest = rewritten_and_vacuumed(uri)
    with pytest.raises(UpstreamError, match=r"upstream version 0 of .* was vacuumed: 1 of its data files are gone "
                                            r"\(.*\.parquet\)\. Pin a newer epoch"):
        check_not_vacuumed(uri, 0)
    check_not_vacuumed(uri, latest)


@pytest.mark.spark
def test_a_snapshot_refuses_a_vacuumed_epoch_and_an_unfinished_one_starts_over(spark, tables, caplog):
    latest = rewritten_and_vacuumed(tables["source"])
    job = BackfillJob(name="vacuumed", query=QUERY, primary_key=["order_id"], backfill_parallelism=2, **tables)
    with pytest.raises(UpstreamError, match="was vacuumed"):
        run_snapshot(spark, job, epoch=0, parallelism=2)
    assert not table_exists(job.target)

    save_progress(job.target, SnapshotProgress(epoch=0, chunks_total=1, rows_total=50, files_total=1))
    with caplog.at_level(logging.WARNING):
        result = run_snapshot(spark, job, parallelism=2)
    assert "cannot resume the snapshot at epoch 0" in caplog.text and "was vacuumed" in caplog.text
    assert result.epoch == latest == read_watermark(job.target, job.app_id)
    expected = table_rows(tables["source"], latest).select(["order_id", "status", "amount"])
    assert table_rows(job.target).sort_by("order_id").to_pylist() == expected.sort_by("order_id").to_pylist()
