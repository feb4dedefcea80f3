"""Keyed commits with key bounds: a round of new keys above the table's largest key is an
append, other rounds are MERGEs bounded by the changes' key range; both leave exactly the
rows an unbounded MERGE would, with the watermark and an exact change feed."""

from __future__ import annotations

import datetime

import pytest
from deltalake import DeltaTable

from airflow_backfill.engine.delta.commits import PRESENT, TABLE_PROPERTIES, append, merge_keyed
from airflow_backfill.engine.delta.key_range import EMPTY, KeyRange, all_above, key_range, table_key_max

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


def merge(spark, uri: str, frame, version: int, key=("k",), null_safe: bool = False) -> int:
    return merge_keyed(spark, uri, frame, list(key), app_id=APP, version=version, user_metadata="{}",
                       null_safe=null_safe)


def rows_of(spark, uri: str) -> list[tuple]:
    return sorted((tuple(r) for r in spark.read.format("delta").load(uri).collect()),
                  key=lambda r: (r[0] is not None, r))


def last_operation(uri: str) -> str:
    return DeltaTable(uri).history(limit=1)[0]["operation"]


def feed_of(spark, uri: str, version: int) -> list[tuple]:
    feed = (spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", version)
            .option("endingVersion", version).load(uri))
    return sorted((r["k"], r["_change_type"]) for r in feed.collect())


def test_a_round_of_new_keys_above_the_table_is_an_append(spark, tmp_path):
    uri = str(tmp_path / "mv")
    create(spark, uri, [(k, f"v{k}") for k in range(1, 11)], "k long, v string")

    applied = merge(spark, uri, changes(spark, [(11, "new", True), (12, "new", True), (13, None, None)],
                                        "k long, v string"), version=1)

    assert applied == 2
    assert last_operation(uri) == "WRITE"
    assert rows_of(spark, uri) == [(k, f"v{k}") for k in range(1, 11)] + [(11, "new"), (12, "new")]
    assert DeltaTable(uri).transaction_version(APP) == 1
    assert feed_of(spark, uri, 1) == [(11, "insert"), (12, "insert")]
    # The same version again changes nothing (the watermark tells).
    assert merge(spark, uri, changes(spark, [(14, "x", True)], "k long, v string"), version=1) == 0
    assert len(rows_of(spark, uri)) == 12


def test_a_round_touching_old_keys_is_a_bounded_merge_with_the_same_result(spark, tmp_path):
    uri = str(tmp_path / "mv")
    create(spark, uri, [(k, f"v{k}") for k in range(1, 11)], "k int, v string")

    applied = merge(spark, uri, changes(spark, [(5, "five", True), (3, None, None), (20, "twenty", True)],
                                        "k int, v string"), version=1)

    assert applied == 3
    assert last_operation(uri) == "MERGE"
    expected = {k: f"v{k}" for k in range(1, 11) if k != 3} | {5: "five", 20: "twenty"}
    assert rows_of(spark, uri) == sorted(expected.items())
    assert feed_of(spark, uri, 1) == [(3, "delete"), (5, "update_postimage"), (5, "update_preimage"),
                                      (20, "insert")]


def test_null_keys_are_matched_null_safely_inside_the_bounds(spark, tmp_path):
    uri = str(tmp_path / "state")
    create(spark, uri, [(None, 1), (1, 1), (2, 1)], "k int, n long")

    # A NULL group and a new group above the table's maximum: not an append (NULL matches NULL).
    merge(spark, uri, changes(spark, [(None, 5, True), (9, 1, True)], "k int, n long"), version=1, null_safe=True)
    assert last_operation(uri) == "MERGE"
    assert rows_of(spark, uri) == [(None, 5), (1, 1), (2, 1), (9, 1)]

    merge(spark, uri, changes(spark, [(None, None, None), (2, 7, True)], "k int, n long"), version=2, null_safe=True)
    assert rows_of(spark, uri) == [(1, 1), (2, 7), (9, 1)]


def test_date_keys_and_composite_keys_are_bounded_by_their_leading_column(spark, tmp_path):
    uri = str(tmp_path / "mv")
    day = datetime.date(2024, 1, 1)
    create(spark, uri, [(day, line, line * 10) for line in (1, 2)], "d date, line int, x int")
    schema = "d date, line int, x int"

    merge(spark, uri, changes(spark, [(day, 2, 99, True), (day + datetime.timedelta(1), 1, 5, True)], schema),
          version=1, key=("d", "line"))
    assert last_operation(uri) == "MERGE"  # the range reaches the table's last day
    merge(spark, uri, changes(spark, [(day + datetime.timedelta(2), 1, 7, True)], schema), version=2,
          key=("d", "line"))
    assert last_operation(uri) == "WRITE"
    assert rows_of(spark, uri) == [(day, 1, 10), (day, 2, 99), (day + datetime.timedelta(1), 1, 5),
                                   (day + datetime.timedelta(2), 1, 7)]


def test_without_statistics_or_with_string_keys_every_round_is_a_plain_merge(spark, tmp_path):
    unindexed = str(tmp_path / "unindexed")
    create(spark, unindexed, [(1, "a")], "k long, v string", **{"delta.dataSkippingNumIndexedCols": "0"})
    assert table_key_max(unindexed, "k") is None
    merge(spark, unindexed, changes(spark, [(5, "b", True)], "k long, v string"), version=1)
    assert last_operation(unindexed) == "MERGE"
    assert rows_of(spark, unindexed) == [(1, "a"), (5, "b")]

    strings = str(tmp_path / "strings")
    create(spark, strings, [("a", 1)], "k string, v long")
    merge(spark, strings, changes(spark, [("b", 2, True)], "k string, v long"), version=1)
    assert last_operation(strings) == "MERGE"
    assert rows_of(spark, strings) == [("a", 1), ("b", 2)]


def test_key_range_and_table_maximum(spark, tmp_path):
    frame = changes(spark, [(4, True), (None, None), (9, None)], "k long")
    assert key_range(frame, "k", PRESENT) == KeyRange("k", 4, 9, True, 1)

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
