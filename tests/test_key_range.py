"""What a round learns about its keys cheaply: their range (one job over the changes) and
the target's largest key and rows within that range (its files' statistics, no data read).
The ways these facts pick are tested in test_keyed_writes.py."""

from __future__ import annotations

import pytest

from airflow_backfill.engine.delta.commits import PRESENT, TABLE_PROPERTIES, append
from airflow_backfill.engine.delta.key_range import (
    EMPTY,
    KeyRange,
    all_above,
    key_range,
    rows_in_range,
    table_key_max,
    table_rows,
)

pytestmark = pytest.mark.spark

APP = "airflow_backfill/test"


def create(spark, uri: str, rows: list[tuple], schema: str, **properties: str) -> None:
    writer = spark.createDataFrame(rows, schema).write.format("delta").mode("append")
    for key, value in {**TABLE_PROPERTIES, **properties}.items():
        writer = writer.option(key, value)
    writer.option("txnAppId", APP).option("txnVersion", "0").save(uri)


def changes(spark, rows: list[tuple], schema: str):
    """Keyed changes: a row with `__present` true is upserted, one with NULL deletes its key."""
    return spark.createDataFrame(rows, f"{schema}, {PRESENT} boolean")


def test_key_range_and_table_maximum(spark, tmp_path):
    frame = changes(spark, [(4, True), (None, None), (9, None)], "k long")
    assert key_range(frame, "k", PRESENT) == KeyRange("k", 4, 9, True, 1, 3)
    flagged = frame.selectExpr("*", "k > 5 AS arrived")
    assert key_range(flagged, "k", PRESENT, "arrived").flagged_rows == 1

    uri = str(tmp_path / "t")
    append(spark.createDataFrame([], "k long"), uri, app_id=APP, version=0, user_metadata="{}", create=True)
    assert table_key_max(uri, "k") is EMPTY
    append(spark.createDataFrame([(None,)], "k long"), uri, app_id=APP, version=1, user_metadata="{}")
    assert table_key_max(uri, "k") is EMPTY  # only NULL keys: every key is above
    append(spark.createDataFrame([(3,), (8,)], "k long"), uri, app_id=APP, version=2, user_metadata="{}")
    assert table_key_max(uri, "k") == 8

    assert all_above(KeyRange("k", 9, 12, False, 2), 8)
    assert not all_above(KeyRange("k", 8, 12, False, 2), 8)
    assert not all_above(KeyRange("k", 9, 12, True, 2), 8)
    assert not all_above(KeyRange("k", 9, 12, False, 2), None)
    assert all_above(KeyRange("k", None, None, False, 0), None) is False
    assert all_above(KeyRange("k", None, None, False, 0), 8)


def test_rows_in_the_changes_range_from_file_statistics(spark, tmp_path):
    uri = str(tmp_path / "t")
    for version, keys in enumerate(([1, 2, 3], [10, 11], [20, 21, 22, 23])):
        append(spark.createDataFrame([(k,) for k in keys], "k long").coalesce(1), uri, app_id=APP, version=version,
               user_metadata="{}", create=version == 0)
    assert table_rows(uri) == 9
    assert table_rows(uri, version=1) == 5
    assert rows_in_range(uri, "k", KeyRange("k", 11, 12, False, 1)) == (9, 2)
    assert rows_in_range(uri, "k", KeyRange("k", 3, 20, False, 1)) == (9, 9)
    assert rows_in_range(uri, "k", KeyRange("k", 30, 40, False, 1)) == (9, 0)
    assert rows_in_range(uri, "k", KeyRange("k", None, None, False, 0)) == (9, 0)  # no change: nothing touched
    assert rows_in_range(uri, "k", KeyRange("k", 11, 12, True, 1)) == (9, 9)  # a NULL key may be anywhere
    assert rows_in_range(uri, "k", None) == (9, 9)  # no usable statistics

    unindexed = str(tmp_path / "unindexed")
    create(spark, unindexed, [(1, "a"), (2, "b")], "k long, v string", **{"delta.dataSkippingNumIndexedCols": "0"})
    assert table_key_max(unindexed, "k") is None
    assert rows_in_range(unindexed, "k", KeyRange("k", 5, 6, False, 1)) == (2, 2)
