"""The harness's oracle (tests/spark_oracle.py) can fail: MV rows with a value off (an
hour on an instant, -0.0 for 0.0, a map for a NULL) are named row by row, and a version
equal to Spark's recompute passes, whatever order its maps list their entries in."""

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
