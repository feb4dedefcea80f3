"""The harness's oracle (tests/spark_oracle.py) can fail: MV rows with a value off (an
hour on an instant, -0.0 for 0.0, a map for a NULL, a value inside a nested map) are named
row by row, and a version equal to Spark's recompute passes, whatever order its maps, at any
depth, list their entries in."""

from __future__ import annotations

import datetime as dt

import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from spark_oracle import differences

pytestmark = pytest.mark.spark

APP = "oracle_test"
QUERY = "SELECT id, ts, d, mp FROM source"
SCHEMA = "id BIGINT, ts TIMESTAMP, d DOUBLE, mp MAP<STRING, INT>"
ROWS = [
    (1, dt.datetime(1883, 11, 18, 12, 3, 58, 1), 0.0, {"a": 1, "b": None}),
    (2, dt.datetime(2026, 3, 8, 7, 30), float("nan"), {"z": 2, "y": 3}),
    (3, None, float("-inf"), None),
]


def _upstream(spark, path: str) -> str:
    spark.createDataFrame(ROWS, SCHEMA).write.format("delta").save(path)
    return path


def _mv(spark, path: str, rows: list[tuple] | DataFrame) -> str:
    """An MV at the upstream's version 0 (the app transaction the engine's commits carry)."""
    frame = rows if isinstance(rows, DataFrame) else spark.createDataFrame(rows, SCHEMA)
    frame.write.format("delta").option("txnAppId", APP).option("txnVersion", 0).save(path)
    return path


def test_an_equal_version_passes_whatever_order_its_maps_hold(spark, tmp_path):
    upstream = _upstream(spark, str(tmp_path / "upstream"))
    stored = spark.read.format("delta").load(upstream)
    reordered = stored.withColumn("mp", F.map_from_entries(F.reverse(F.map_entries("mp"))))
    def keys(frame: DataFrame) -> list:
        return [row[0] for row in frame.orderBy("id").select(F.map_keys("mp")).collect()]

    assert keys(reordered) != keys(stored)  # the MV stores each map's entries in another order
    target = _mv(spark, str(tmp_path / "mv"), reordered.orderBy(F.desc("id")))
    assert differences(spark, target, APP, QUERY, {"source": upstream}) == ([], 1)


def test_a_version_with_values_off_is_named_row_by_row(spark, tmp_path):
    upstream = _upstream(spark, str(tmp_path / "upstream"))
    (one, ts, d, mp), (two, ts2, d2, mp2), (three, _, d3, _) = ROWS
    changed = [
        (one, ts, -0.0, mp),  # the sign of zero
        (two, ts2 + dt.timedelta(hours=1), d2, mp2),  # an hour off
        (three, None, d3, {"a": 0}),  # a map for a NULL
    ]
    target = _mv(spark, str(tmp_path / "mv"), changed)
    problems, checked = differences(spark, target, APP, QUERY, {"source": upstream})
    sides = sorted(problem.split(", ", 1)[1].partition(": ")[0] for problem in problems)
    assert checked == 1 and sides == 3 * ["in Spark's recompute, not in the MV (1x)"] + \
        3 * ["in the MV, not in Spark's recompute (1x)"], problems


NESTED_QUERY = "SELECT id, outer FROM source"
NESTED_SCHEMA = "id BIGINT, outer STRUCT<tags: MAP<STRING, MAP<STRING, INT>>, lists: ARRAY<MAP<INT, STRING>>>"
NESTED_ROWS = [
    (1, ({"a": {"x": 1, "y": 2}, "b": {}}, [{1: "one", 2: "two"}, {3: None}])),
    (2, None),
    (3, (None, [None, {4: "four", 5: "five"}])),
]


def _reversed_maps(frame: DataFrame) -> DataFrame:
    """`frame` with every map's entries in reverse order, at each depth."""
    def flipped(column):
        return F.map_from_entries(F.reverse(F.map_entries(column)))

    tags = F.transform_values(flipped(F.col("outer.tags")), lambda _, inner: flipped(inner))
    lists = F.transform(F.col("outer.lists"), flipped)
    rebuilt = F.when(F.col("outer").isNull(), F.lit(None)).otherwise(F.struct(tags.alias("tags"), lists.alias("lists")))
    return frame.withColumn("outer", rebuilt)


def test_nested_maps_in_another_order_pass_and_a_nested_value_off_is_named(spark, tmp_path):
    upstream = str(tmp_path / "upstream")
    spark.createDataFrame(NESTED_ROWS, NESTED_SCHEMA).write.format("delta").save(upstream)
    stored = spark.read.format("delta").load(upstream)
    reordered = _reversed_maps(stored)
    as_json = [row[0] for row in reordered.orderBy("id").select(F.to_json("outer")).collect()]
    assert as_json != [row[0] for row in stored.orderBy("id").select(F.to_json("outer")).collect()]
    target = str(tmp_path / "mv")
    reordered.write.format("delta").option("txnAppId", APP).option("txnVersion", 0).save(target)
    assert differences(spark, target, APP, NESTED_QUERY, {"source": upstream}) == ([], 1)

    off = str(tmp_path / "mv_off")  # one inner value off, and a NULL struct as a struct of NULLs
    rows = [(1, ({"a": {"x": 1, "y": 3}, "b": {}}, [{1: "one", 2: "two"}, {3: None}])), (2, (None, None)),
            NESTED_ROWS[2]]
    spark.createDataFrame(rows, NESTED_SCHEMA).write.format("delta").option("txnAppId", APP) \
        .option("txnVersion", 0).save(off)
    problems, checked = differences(spark, off, APP, NESTED_QUERY, {"source": upstream})
    sides_and_rows = sorted((problem.split(", ", 1)[1].partition(" (")[0], problem.partition(": ")[2][:8])
                            for problem in problems)
    assert checked == 1 and sides_and_rows == [
        ("in Spark's recompute, not in the MV", '{"id":1,'), ("in Spark's recompute, not in the MV", '{"id":2}'),
        ("in the MV, not in Spark's recompute", '{"id":1,'), ("in the MV, not in Spark's recompute", '{"id":2,'),
    ], problems
