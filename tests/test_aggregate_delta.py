"""A range's delta combined on the driver equals Spark's own aggregation of the same rows,
and the types Arrow would combine differently from Spark go to Spark."""

from __future__ import annotations

import datetime
import random
from decimal import Decimal

import pyarrow as pa
import pytest

from airflow_backfill.engine import aggregate_sql as sql
from airflow_backfill.engine.aggregate_delta import CHANGES_VIEW, _combinable_on_driver, range_delta
from airflow_backfill.engine.query import plan_query

UPSTREAM = pa.schema([
    ("id", pa.int64()), ("g", pa.string()), ("h", pa.int32()), ("x", pa.int64()),
    ("d", pa.decimal128(12, 2)), ("day", pa.date32()), ("f", pa.float64()),
])
CHANGE_TYPES = ["insert", "delete", "update_preimage", "update_postimage"]


def _feed(rows: int, seed: int, *, x_range: tuple[int, int] = (-50, 50)) -> pa.Table:
    """Random change rows with NULLs in every column and every change type."""
    rng = random.Random(seed)

    def maybe(value: object) -> object:
        return None if rng.random() < 0.15 else value

    columns = {
        "id": list(range(rows)),
        "g": [maybe(rng.choice("abc")) for _ in range(rows)],
        "h": [maybe(rng.randint(0, 2)) for _ in range(rows)],
        "x": [maybe(rng.randint(*x_range)) for _ in range(rows)],
        "d": [maybe(Decimal(rng.randint(-10_000, 10_000)) / 100) for _ in range(rows)],
        "day": [maybe(datetime.date(2024, 1, 1) + datetime.timedelta(days=rng.randint(0, 90))) for _ in range(rows)],
        "f": [maybe(rng.uniform(-1, 1)) for _ in range(rows)],
    }
    table = pa.table(columns, schema=UPSTREAM)
    return (
        table.append_column("_change_type", pa.array([rng.choice(CHANGE_TYPES) for _ in range(rows)]))
        .append_column("_commit_version", pa.array([1] * rows, pa.int64()))
        .append_column("_commit_timestamp", pa.array([0] * rows, pa.timestamp("us", tz="UTC")))
    )


def _state_schema(spark, aggregate):
    """The state's Spark schema, as the snapshot types it."""
    from pyspark.sql.pandas.types import from_arrow_schema

    spark.createDataFrame([], from_arrow_schema(UPSTREAM)).createOrReplaceTempView("source")
    return spark.sql(sql.state_sql(aggregate)).schema


def _sorted_rows(table: pa.Table, keys: list[str]) -> list[dict]:
    return sorted(table.to_pylist(), key=lambda row: tuple((row[k] is None, str(row[k])) for k in keys))


def _delta_both_ways(spark, query: str, feed: pa.Table) -> tuple[pa.Table, pa.Table, bool]:
    aggregate = plan_query(query, ("id",)).aggregate
    schema = _state_schema(spark, aggregate)
    combined = range_delta(spark, aggregate, feed, schema)
    by_spark = spark.sql(sql.delta_sql(aggregate, CHANGES_VIEW)).toArrow()  # the view range_delta made
    on_driver = _combinable_on_driver(aggregate, {f.name: f.dataType for f in schema.fields})
    return combined, by_spark, on_driver


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_driver_combines_counts_sums_and_extremes_as_spark_does(spark, seed):
    query = (
        "SELECT g, h, COUNT(*) AS n, COUNT(x) AS cx, SUM(x) AS sx, AVG(d) AS ad, SUM(f) AS sf, MIN(d) AS mind, "
        "MAX(day) AS maxday, MIN(x) AS minx FROM source WHERE id % 5 <> 1 GROUP BY g, h"
    )
    combined, by_spark, on_driver = _delta_both_ways(spark, query, _feed(400, seed))
    assert on_driver, "this query's delta should be combined on the driver"
    keys = ["__g0", "__g1"]
    assert combined.schema.names == by_spark.schema.names
    expected = _sorted_rows(by_spark, keys)
    actual = _sorted_rows(combined, keys)
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected, strict=True):
        assert got.keys() == want.keys()
        for column in got:
            if isinstance(want[column], float):
                assert got[column] == pytest.approx(want[column], rel=1e-9, abs=1e-12), column
            else:
                assert got[column] == want[column], (column, got, want)


def test_floating_point_extremes_and_keys_are_left_to_spark(spark):
    feed = _feed(200, 7)
    for query in ("SELECT g, MAX(f) AS mf FROM source GROUP BY g", "SELECT f, COUNT(*) AS n FROM source GROUP BY f"):
        combined, by_spark, on_driver = _delta_both_ways(spark, query, feed)
        assert not on_driver, query
        assert _sorted_rows(combined, ["__g0"]) == _sorted_rows(by_spark, ["__g0"])


def test_an_integer_sum_that_overflows_is_an_error_not_a_wrapped_value(spark):
    feed = _feed(50, 3, x_range=(2**62, 2**62 + 10)).filter(pa.compute.equal(pa.compute.field("_change_type"), "insert"))
    aggregate = plan_query("SELECT h, SUM(x) AS sx FROM source GROUP BY h", ("id",)).aggregate
    with pytest.raises(pa.ArrowInvalid, match="out of bounds|overflow"):
        range_delta(spark, aggregate, feed, _state_schema(spark, aggregate))
