"""An overwrite whose one file the driver writes: the same rows, statistics and change feed
as Spark's own overwrite, readable by Spark and delta-rs, refused (nothing written) for
rows that do not fit the table."""

from __future__ import annotations

import datetime
import json
import os
from decimal import Decimal

import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder

from airflow_backfill.engine.delta.commits import TABLE_PROPERTIES, overwrite, overwrite_rows
from airflow_backfill.engine.delta.driver_file import STRING_BOUND_CHARS, statistics

pytestmark = pytest.mark.spark

APP = "airflow_backfill/driver-file-test"
SCHEMA = "k BIGINT NOT NULL, amount DECIMAL(12,2), day DATE, name STRING, ratio DOUBLE, flag BOOLEAN"
LONG_NAME = "x" * (STRING_BOUND_CHARS + 1)


def _rows() -> list[tuple]:
    return [
        (1, Decimal("10.50"), datetime.date(1995, 3, 15), "alpha", 0.5, True),
        (2, None, datetime.date(1994, 1, 1), None, None, None),
        (3, Decimal("-7.25"), None, "beta", 1.5, False),
    ]


def _arrow(rows: list[tuple]) -> pa.Table:
    columns = list(zip(*rows, strict=True))
    types = [pa.int64(), pa.decimal128(12, 2), pa.date32(), pa.string(), pa.float64(), pa.bool_()]
    names = ["k", "amount", "day", "name", "ratio", "flag"]
    return pa.table([pa.array(list(values), type) for values, type in zip(columns, types, strict=True)], names=names)


def _create(spark, uri: str) -> None:
    writer = spark.createDataFrame([(9, None, None, "old", None, None)], SCHEMA).write.format("delta")
    for key, value in TABLE_PROPERTIES.items():
        writer = writer.option(key, value)
    writer.save(uri)


def _delta_rs_rows(uri: str) -> list[dict]:
    table = QueryBuilder().register("t", DeltaTable(uri)).execute("select * from t order by k").read_all()
    return pa.table(table).to_pylist()


def _added_stats(uri: str) -> dict:
    """The statistics of the one file the table's latest commit added."""
    with open(f"{uri}/_delta_log/{DeltaTable(uri).version():020d}.json") as entry:
        added = [json.loads(line)["add"] for line in entry if '"add"' in line]
    assert len(added) == 1
    return json.loads(added[0]["stats"])


def test_the_driver_writes_what_spark_writes_and_delta_reads_it(spark, tmp_path):
    by_driver, by_spark = str(tmp_path / "driver"), str(tmp_path / "spark")
    _create(spark, by_driver)
    _create(spark, by_spark)
    assert overwrite_rows(spark, _arrow(_rows()), by_driver, app_id=APP, version=1, user_metadata="{}") is True
    overwrite(spark.createDataFrame(_rows(), SCHEMA).coalesce(1), by_spark, app_id=APP, version=1,
              user_metadata="{}")
    read = [sorted(tuple(r) for r in spark.read.format("delta").load(uri).collect()) for uri in (by_driver, by_spark)]
    assert read[0] == read[1] == sorted(_rows())
    assert _delta_rs_rows(by_driver) == _delta_rs_rows(by_spark)
    assert DeltaTable(by_driver).transaction_version(APP) == 1

    driver, spark_stats = _added_stats(by_driver), _added_stats(by_spark)
    assert driver["numRecords"] == spark_stats["numRecords"] == 3
    assert driver["nullCount"] == spark_stats["nullCount"]
    bounded = ["k", "amount", "day", "name"]  # the columns the driver bounds: Spark's bounds exactly
    for side in ("minValues", "maxValues"):
        assert {c: driver[side][c] for c in bounded} == {c: spark_stats[side][c] for c in bounded}
        assert not set(driver[side]) - set(bounded)

    # The change feed of the overwrite: the old row deleted, every new row inserted, as Spark's.
    feeds = [sorted((r["k"], r["_change_type"]) for r in spark.read.format("delta").option("readChangeFeed", "true")
                    .option("startingVersion", 1).load(uri).collect()) for uri in (by_driver, by_spark)]
    assert feeds[0] == feeds[1] == [(1, "insert"), (2, "insert"), (3, "insert"), (9, "delete")]

    # Files skipped by the driver's bounds return what a full read returns.
    assert spark.read.format("delta").load(by_driver).where("k > 2 AND day IS NULL").count() == 1
    assert spark.read.format("delta").load(by_driver).where("name = 'zeta'").count() == 0


def test_long_strings_and_all_null_columns_get_no_bounds():
    stats = json.loads(statistics(_arrow([(1, None, None, LONG_NAME, None, None),
                                          (2, None, None, "short", None, None)])))
    assert "name" not in stats["minValues"] and "amount" not in stats["maxValues"]
    assert stats["nullCount"]["amount"] == 2 and stats["numRecords"] == 2


def test_rows_that_do_not_fit_the_table_are_left_to_spark(spark, tmp_path):
    uri = str(tmp_path / "t")
    properties = ", ".join(f"'{key}' = '{value}'" for key, value in TABLE_PROPERTIES.items())
    spark.sql(f"CREATE TABLE delta.`{uri}` ({SCHEMA}) USING delta TBLPROPERTIES ({properties})")
    spark.sql(f"INSERT INTO delta.`{uri}` VALUES (9, NULL, NULL, 'old', NULL, NULL)")
    before = DeltaTable(uri).version()
    wrong_type = _arrow(_rows()).set_column(0, "k", pa.array([1, 2, 3], pa.int32()))
    null_key = _arrow([(None, None, None, None, None, None)])
    for rows in (wrong_type, null_key, _arrow(_rows()).select(["k", "amount"])):
        assert overwrite_rows(spark, rows, uri, app_id=APP, version=1, user_metadata="{}") is None
    assert DeltaTable(uri).version() == before
    assert sorted(tuple(r)[0] for r in spark.read.format("delta").load(uri).collect()) == [9]

    spark.sql(f"ALTER TABLE delta.`{uri}` ADD CONSTRAINT positive CHECK (k > 0)")  # only Delta's writer checks it
    assert overwrite_rows(spark, _arrow(_rows()), uri, app_id=APP, version=1, user_metadata="{}") is None


def test_delta_log_entries_on_local_tables_have_no_hadoop_checksum_files(spark, tmp_path):
    """Hadoop's checksummed local file system writes `.<name>.crc` beside each file (and
    starts a process for each); the sessions write Delta's log through the raw one. Delta's
    own version checksums (`<version>.crc`, no leading dot) stay."""
    uri = str(tmp_path / "t")
    spark.range(3).write.format("delta").save(uri)
    spark.range(2).write.format("delta").mode("append").save(uri)
    names = os.listdir(os.path.join(uri, "_delta_log"))
    assert [name for name in names if name.startswith(".") and name.endswith(".json.crc")] == []
    assert "00000000000000000001.json" in names and spark.read.format("delta").load(uri).count() == 5
