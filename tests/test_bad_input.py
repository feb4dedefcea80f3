"""Bad input fails with a message that names the problem, before anything is written."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from airflow_backfill.engine.delta.log import refuse_key_not_held
from airflow_backfill.engine.phases.catch_up import run_catch_up
from airflow_backfill.engine.phases.snapshot import run_snapshot
from airflow_backfill.exceptions import TargetError, UnsupportedQueryError, UpstreamError
from airflow_backfill.job import BackfillJob

pytestmark = pytest.mark.spark


def job_for(tables: dict[str, str], query: str = "SELECT order_id, status FROM source",
            key: str = "order_id") -> BackfillJob:
    return BackfillJob(name="orders_mv", query=query, primary_key=[key], **tables)


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


def test_unsupported_query_is_refused_when_the_job_loads(tables):
    with pytest.raises(UnsupportedQueryError, match="window functions"):
        job_for(tables, "SELECT order_id, rank() OVER (ORDER BY status) AS r FROM source")
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


@pytest.mark.parametrize("key, refusal", [
    ("ORDER_ID", "spells this column 'order_id'; write it so .*primary_key: \\[order_id\\]"),
    ("id", "'id' is not a column of upstream .*its columns: order_id, status"),
])
def test_a_key_the_upstream_does_not_hold_as_written_is_refused_before_any_round(spark, tables, key, refusal):
    """Spark would match `ORDER_ID` to `order_id` and build the MV; every round, which reads
    changes as Arrow rows, would then fail. Refused at the snapshot and at every round."""
    small_table(tables["source"], cdf=True)
    with pytest.raises(UpstreamError, match=refusal):
        run_snapshot(spark, job_for(tables, query="SELECT * FROM source", key=key))
    assert not os.path.exists(tables["target"])
    run_snapshot(spark, job_for(tables))
    version = DeltaTable(tables["target"]).version()
    write_deltalake(tables["source"], pa.table({"order_id": pa.array([3], pa.int64()), "status": ["new"]}),
                    mode="append")
    with pytest.raises(UpstreamError, match=refusal):
        run_catch_up(spark, job_for(tables, query="SELECT * FROM source", key=key))
    assert DeltaTable(tables["target"]).version() == version



def test_the_refusal_spells_every_key_column_as_the_upstream_does():
    with pytest.raises(UpstreamError, match=r"primary_key 'Shop_Id': .*spells this column 'shop_id'.*"
                                            r"primary_key: \[shop_id, day\]\)"):
        refuse_key_not_held("/lake/sales", ["shop_id", "day", "amount"], ["Shop_Id", "DAY"])
    refuse_key_not_held("/lake/sales", ["shop_id", "day", "amount"], ["shop_id", "day"])
