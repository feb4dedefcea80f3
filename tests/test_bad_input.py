"""Bad input fails with a message that names the problem, before anything is written."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from airflow_backfill.engine.phases.catch_up import run_catch_up
from airflow_backfill.engine.phases.snapshot import run_snapshot
from airflow_backfill.exceptions import TargetError, UnsupportedQueryError, UpstreamError
from airflow_backfill.job import BackfillJob

pytestmark = pytest.mark.spark


def job_for(tables: dict[str, str], query: str = "SELECT order_id, status FROM source") -> BackfillJob:
    return BackfillJob(name="orders_mv", query=query, primary_key=["order_id"], **tables)


def small_table(path: str, *, cdf: bool) -> None:
    data = pa.table({"order_id": pa.array([1, 2], pa.int64()), "status": ["new", "paid"]})
    configuration = {"delta.enableChangeDataFeed": "true"} if cdf else None
    write_deltalake(path, data, configuration=configuration)


def test_upstream_without_change_data_feed(spark, tables):
    small_table(tables["source"], cdf=False)
    with pytest.raises(UpstreamError, match="does not have the Change Data Feed enabled"):
        run_snapshot(spark, job_for(tables))
    assert not os.path.exists(tables["target"])


def test_missing_upstream(spark, tables):
    with pytest.raises(UpstreamError, match="is not a Delta table .*check the job's `source`"):
        run_snapshot(spark, job_for(tables))
    assert not os.path.exists(tables["target"])


def test_unsupported_query(spark, tables):
    small_table(tables["source"], cdf=True)
    with pytest.raises(UnsupportedQueryError, match="window functions"):
        run_snapshot(spark, job_for(tables, "SELECT order_id, rank() OVER (ORDER BY status) AS r FROM source"))
    assert not os.path.exists(tables["target"])


def test_catch_up_before_snapshot(spark, tables):
    small_table(tables["source"], cdf=True)
    with pytest.raises(TargetError, match="run the snapshot phase first"):
        run_catch_up(spark, job_for(tables))
    assert not os.path.exists(tables["target"])


def test_target_written_by_someone_else(spark, tables):
    small_table(tables["source"], cdf=True)
    small_table(tables["target"], cdf=True)
    with pytest.raises(TargetError, match="was not built by this job"):
        run_snapshot(spark, job_for(tables))
