"""A recompute written as its difference: rows equal in every column are left alone, a row
that differs in any one column of any type is written again, and the table's change feed
holds the changed rows only (tests of `engine/rounds/difference.py`)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from deltalake import DeltaTable

from airflow_backfill.engine.delta.commits import PRESENT, TABLE_PROPERTIES, append
from airflow_backfill.engine.planning.round_plan import Rates
from airflow_backfill.engine.rounds.difference import keyed_difference, write_difference
from oracle import assert_rows_match, mv_rows

pytestmark = pytest.mark.spark

COLUMNS = {  # name: (the base row's value, the same value written otherwise or None, a value that differs)
    "i": ("CAST(1 AS INT)", None, "CAST(2 AS INT)"),
    "dec": ("CAST(1.50 AS DECIMAL(10,2))", "CAST(1.5 AS DECIMAL(10,2))", "CAST(1.51 AS DECIMAL(10,2))"),
    "s": ("'abc'", None, "'abd'"),
    "ci": ("'Abc' COLLATE UTF8_LCASE", None, "'abc' COLLATE UTF8_LCASE"),  # equal to Spark's <=>
    "bin": ("X'0102'", None, "X'0103'"),
    "flag": ("true", None, "false"),
    "day": ("DATE'2024-01-01'", None, "DATE'2024-01-02'"),
    "ts": ("TIMESTAMP'2024-01-01 00:00:00Z'", "TIMESTAMP'2023-12-31 19:00:00-05:00'",
           "TIMESTAMP'2024-01-01 00:00:00.000001Z'"),
    "ntz": ("TIMESTAMP_NTZ'2024-01-01 00:00:00'", None, "TIMESTAMP_NTZ'2024-01-01 00:00:00.000001'"),
    "f": ("CAST(0.0 AS FLOAT)", None, "CAST('-0.0' AS FLOAT)"),  # equal to Spark's <=>
    "d_nan": ("CAST('NaN' AS DOUBLE)", "CAST('NaN' AS DOUBLE) + 1", "CAST(1.0 AS DOUBLE)"),
    "d_zero": ("CAST('-0.0' AS DOUBLE)", None, "CAST(0.0 AS DOUBLE)"),  # equal to Spark's <=>
    "d_null": ("CAST(NULL AS DOUBLE)", None, "CAST(0.0 AS DOUBLE)"),
    "arr": ("array(0.0D, 1.0D)", None, "array(CAST('-0.0' AS DOUBLE), 1.0D)"),
    "arr_len": ("array(1, 2)", None, "array(1, 2, NULL)"),
    "st": ("named_struct('x', 0.0D, 't', TIMESTAMP'2024-01-01 00:00:00Z')", None,
           "named_struct('x', CAST('-0.0' AS DOUBLE), 't', TIMESTAMP'2024-01-01 00:00:00Z')"),
    "st_null": ("CAST(NULL AS STRUCT<x: INT>)", None, "named_struct('x', CAST(NULL AS INT))"),
    "mp": ("map('a', 1.0D, 'b', 2.0D)", "map('b', 2.0D, 'a', 1.0D)", "map('a', 1.0D, 'b', CAST(-2.0 AS DOUBLE))"),
    "mp_nested": ("map(1, array(CAST(0.0 AS FLOAT)))", None, "map(1, array(CAST('-0.0' AS FLOAT)))"),
    "mp_keys": ("map(1, 'x')", None, "map(2, 'x')"),
    "mp_null": ("map('a', 1, 'b', CAST(NULL AS INT))", "map('b', CAST(NULL AS INT), 'a', 1)", "map('a', 1, 'b', 0)"),
    "st_mp": ("named_struct('m', map('z', CAST(NULL AS DOUBLE)))", None, "named_struct('m', map('z', 0.0D))"),
    "arr_mp": ("array(map('k', CAST(NULL AS BIGINT)))", None, "array(map('k', 0L))"),
    "span": ("INTERVAL '1' DAY", None, "INTERVAL '2' DAY"),
}


def rows(spark, values: dict[int, dict[str, str]]):
    """One row per id, each column's SQL expression given or the base row's."""
    selects = [f"SELECT {row_id} AS id, " + ", ".join(f"{expressions.get(name, base)} AS {name}"
                                                      for name, (base, _, _) in COLUMNS.items())
               for row_id, expressions in sorted(values.items())]
    return spark.sql(" UNION ALL ".join(selects))


def spark_feed(spark, uri: str, version: int) -> list[tuple[int, str]]:
    """(id, change type) of one version's change feed, as Spark reads it (delta-rs 1.6 misreads
    commits over deletion vectors)."""
    feed = (spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", version)
            .option("endingVersion", version).load(uri))
    return [(row["id"], row["_change_type"]) for row in feed.select("id", "_change_type").collect()]


def changes_by_id(frame) -> dict[int, bool | None]:
    return {row["id"]: row[PRESENT] for row in frame.select("id", PRESENT).collect()}


def test_rows_equal_in_every_column_give_no_change_and_one_different_column_does(spark):
    names = list(COLUMNS)
    equal_otherwise = {100 + n: {name: COLUMNS[name][1]} for n, name in enumerate(names) if COLUMNS[name][1]}
    differing = {200 + n: {name: COLUMNS[name][2]} for n, name in enumerate(names)}
    current = {0: {}, 1: {}, 90: {}, **{row_id: {} for row_id in (*equal_otherwise, *differing)}}
    recomputed = {0: {}, 1: {}, 91: {}, **equal_otherwise, **differing}
    changes = changes_by_id(keyed_difference(rows(spark, current), rows(spark, recomputed), ["id"]))
    named = {names[row_id % 100] if row_id >= 100 else row_id: (row_id // 100, present)
             for row_id, present in changes.items()}
    assert changes == {**{row_id: True for row_id in differing}, 90: None, 91: True}, named


def test_a_departing_key_keeps_its_key_columns_only(spark):
    gone = keyed_difference(spark.sql("SELECT 'k' AS a, 2 AS b, 'x' AS v"),
                            spark.sql("SELECT 'k' AS a, 3 AS b, 'x' AS v"), ["a", "b"]).orderBy("b").collect()
    assert [(row["a"], row["b"], row["v"], row[PRESENT]) for row in gone] == [("k", 2, None, None),
                                                                               ("k", 3, "x", True)]


def test_null_keys_are_matched_null_safely(spark):
    old = spark.sql("SELECT CAST(NULL AS STRING) AS g, 1 AS n UNION ALL SELECT 'a', 2")
    new = spark.sql("SELECT CAST(NULL AS STRING) AS g, 1 AS n UNION ALL SELECT 'a', 3")
    assert [(row["g"], row["n"]) for row in keyed_difference(old, new, ["g"]).collect()] == [("a", 3)]


def test_a_variant_column_is_always_written_again(spark):
    same = spark.sql("SELECT 1 AS id, parse_json('{\"a\": 1}') AS v")
    assert changes_by_id(keyed_difference(same, same, ["id"])) == {1: True}


def test_written_difference_feeds_the_changed_rows_only(spark, tmp_path: Path):
    uri = str(tmp_path / "mv")
    before = spark.range(0, 200).selectExpr("id", "CAST(id % 7 AS DOUBLE) AS x", "map('k', id) AS m")
    append(before.coalesce(2), uri, app_id="test", version=1, user_metadata="{}", create=True,
           table_properties=TABLE_PROPERTIES)
    after = spark.range(0, 205).where("id NOT IN (3, 4)").selectExpr(  # 14 % 7 is 0.0: -0.0 differs from it
        "id", "CASE WHEN id IN (10, 11, 12) THEN -1.0D WHEN id = 14 THEN CAST('-0.0' AS DOUBLE) "
              "ELSE CAST(id % 7 AS DOUBLE) END AS x", "map('k', id) AS m")
    way, written = write_difference(spark, uri, after, ["id"], app_id="test", version=2, user_metadata="{}",
                                    estimates=lambda prepared: prepared.estimates(Rates()))
    assert written == 2 + 4 + 5  # 2 keys gone, 4 changed, 5 new
    assert way in ("replace", "merge")
    assert_rows_match(after.toArrow(), mv_rows(uri), key=["id"])
    feed = spark_feed(spark, uri, DeltaTable(uri).version())
    assert Counter(kind for _, kind in feed)["insert"] + Counter(kind for _, kind in feed)["update_postimage"] == 9
    assert len(feed) == 2 * 4 + 2 + 5, feed
    assert {row_id for row_id, _ in feed} == {3, 4, 10, 11, 12, 14, 200, 201, 202, 203, 204}


def test_an_unchanged_recompute_commits_only_the_watermark(spark, tmp_path: Path):
    uri = str(tmp_path / "mv")
    table = spark.range(0, 50).selectExpr("id", "CAST(id AS STRING) AS s")
    append(table, uri, app_id="test", version=1, user_metadata="{}", create=True, table_properties=TABLE_PROPERTIES)
    _, written = write_difference(spark, uri, table, ["id"], app_id="test", version=2, user_metadata="{}",
                                  estimates=lambda prepared: prepared.estimates(Rates()))
    assert written == 0
    assert spark_feed(spark, uri, DeltaTable(uri).version()) == []
    assert DeltaTable(uri).transaction_version("test") == 2
