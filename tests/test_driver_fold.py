"""A round's touched groups folded by Arrow equal Spark's fold of the same rows, and what
Arrow would not fold exactly as Spark does is left to Spark."""

from __future__ import annotations

import math
import random
from decimal import Decimal

import pytest

from airflow_backfill.engine.aggregates import apply
from airflow_backfill.engine.aggregates.driver_fold import touched_in_driver
from airflow_backfill.engine.delta.driver_rows import is_local, local_relation
from airflow_backfill.engine.planning import aggregate_sql as sql
from airflow_backfill.engine.planning.query import plan_query

pytestmark = pytest.mark.spark

QUERY = ("SELECT k, COUNT(*) AS n, SUM(v) AS total, COUNT(v) AS counted, AVG(q) AS mean FROM source "
         "WHERE k <> 99 GROUP BY k")
CHANGES = "k long, v decimal(12,2), q int, f double, __sign int"


def _aggregate(query: str = QUERY):
    return plan_query(query, ("id",)).aggregate


def _held(spark, frame):
    """`frame`'s rows as a local relation made from Arrow (as a held state is)."""
    local = local_relation(spark, frame.toArrow(), frame.schema)
    assert local is not None
    return local


def _state(spark, aggregate, rows):
    """A held state of `rows` (k, count, v-sum inputs) built by Spark's own state query."""
    spark.createDataFrame(rows, "id long, k long, v decimal(12,2), q int, f double").createOrReplaceTempView("source")
    return _held(spark, spark.sql(sql.state_sql(aggregate)))


def _changes(spark, rows):
    changes = _held(spark, spark.createDataFrame(rows, CHANGES))
    changes.createOrReplaceTempView(apply._CHANGES)
    return changes


def _sorted(frame):
    return sorted((tuple(row) for row in frame.collect()), key=repr)


UPSTREAM = [(1, 1, Decimal("10.50"), 3, 0.5), (2, 1, None, None, 1.5), (3, 2, Decimal("-4.25"), 7, 2.5),
            (4, 5, Decimal("1.00"), 1, 0.0)]
SIGNED = [(1, Decimal("2.25"), 4, 0.1, 1), (1, Decimal("10.50"), 3, 0.5, -1),  # an update in group 1
          (2, Decimal("-4.25"), 7, 2.5, -1),  # group 2's only row leaves
          (3, None, None, 0.2, 1), (3, Decimal("0.01"), 5, 0.3, 1),  # a new group, a NULL argument
          (99, Decimal("1.00"), 1, 0.0, 1)]  # filtered out by WHERE


def test_arrow_fold_equals_spark_fold_with_nulls_new_and_emptied_groups(spark):
    aggregate = _aggregate()
    state = _state(spark, aggregate, UPSTREAM)
    _changes(spark, SIGNED)
    by_arrow = touched_in_driver(spark, aggregate, apply._CHANGES, state, None, frozenset())
    assert by_arrow is not None and is_local(by_arrow)
    by_spark = apply._touched_by_spark(spark, aggregate, state, None, frozenset())
    assert by_arrow.schema == by_spark.schema
    assert _sorted(by_arrow) == _sorted(by_spark)
    assert {row[0] for row in by_arrow.collect()} == {1, 2, 3}


def test_leaving_groups_are_subtracted_as_spark_subtracts_them(spark):
    aggregate = _aggregate("SELECT k, COUNT(*) AS n, SUM(v) AS total FROM source GROUP BY k")
    state = _state(spark, aggregate, UPSTREAM)
    _changes(spark, [(1, Decimal("2.25"), 4, 0.1, 1), (7, Decimal("3.00"), 1, 0.0, 1)])
    leaving = _held(spark, state.filter("__g0 IN (2, 5)"))
    by_arrow = touched_in_driver(spark, aggregate, apply._CHANGES, state, leaving, frozenset())
    assert by_arrow is not None
    by_spark = apply._touched_by_spark(spark, aggregate, state, leaving, frozenset())
    assert _sorted(by_arrow) == _sorted(by_spark)
    assert {row["__g0"]: row[sql.ROWS] for row in by_arrow.collect()} == {1: 1, 2: -1, 5: -1, 7: 1}


@pytest.mark.parametrize(("query", "signed"), [
    ("SELECT f, COUNT(*) AS n FROM source GROUP BY f", SIGNED),  # a floating-point key: Spark groups NaN, -0.0
    ("SELECT k, COUNT(*) AS n FROM source GROUP BY k", [(None, Decimal("1.00"), 1, 0.0, 1)]),  # a NULL key
    ("SELECT k, SUM(id) AS s FROM source GROUP BY k", None),  # a sum that could overflow 64 bits
    ("SELECT k, SUM(f) AS s FROM source GROUP BY k",  # doubles that overflow in some order of adding
     [(1, None, 1, 1.7976931348623157e308, 1), (1, None, 1, 1.7976931348623157e308, -1), (1, None, 1, 1.0, 1)]),
])
def test_what_arrow_would_not_fold_exactly_is_left_to_spark(spark, query, signed):
    aggregate = _aggregate(query)
    state = _state(spark, aggregate, UPSTREAM)
    if signed is None:
        rows = spark.createDataFrame([(1, 2**62, 1), (1, 2**62, 1)], "k long, id long, __sign int")
        _held(spark, rows).createOrReplaceTempView(apply._CHANGES)
    else:
        _changes(spark, signed)
    assert touched_in_driver(spark, aggregate, apply._CHANGES, state, None, frozenset()) is None


def test_changes_spark_computes_are_left_to_spark(spark):
    aggregate = _aggregate()
    state = _state(spark, aggregate, UPSTREAM)
    cached = spark.createDataFrame(SIGNED, CHANGES).cache()
    cached.createOrReplaceTempView(apply._CHANGES)
    try:
        assert touched_in_driver(spark, aggregate, apply._CHANGES, state, None, frozenset()) is None
    finally:
        cached.unpersist()


EDGE_FLOATS = [0.0, -0.0, float("nan"), float("inf"), float("-inf"), 1e290, -1e290, 3.4028234663852886e38,
               5e-324, -5e-324, 2.2250738585072014e-308, 1e16, 1.0, -1.0, 0.1, None]


def _float_changes(seed: int, groups: int, rows: int) -> list[tuple]:
    """Signed rows of a float and a double column: edge values (NaN, infinities, -0.0, 1e290,
    the largest FLOAT, subnormal doubles, NULL) among random magnitudes, in few groups so
    that terms cancel within a group; one group all NULL, one all -0.0. (Terms that could
    overflow in some order are left to Spark: `test_what_arrow_would_not_fold_exactly_...`.)"""
    rng = random.Random(seed)
    out = []
    for i in range(rows):
        k = rng.randrange(groups)
        if k == 0:  # a group whose every value is NULL: its sum stays NULL
            d = f = None
        elif k == 1:  # a group of -0.0 only: Spark's SUM starts from 0.0
            d = f = -0.0
        elif rng.random() < 0.3:
            d = f = rng.choice(EDGE_FLOATS)
        else:
            d = rng.uniform(-1, 1) * 10.0 ** rng.randint(-300, 280)
            f = rng.uniform(-1, 1) * 10.0 ** rng.randint(-30, 30)
        out.append((k, d, f, rng.choice((1, -1)) if i % 3 else 1))
    return out


def _close(a: float | None, b: float | None, scale: float) -> bool:
    """Equal as IEEE values (NULL, NaN, either infinity), or finite and within the rounding
    two orders of adding terms of total magnitude `scale` can give."""
    if a is None or b is None:
        return a is b
    if math.isnan(a) or math.isnan(b) or math.isinf(a) or math.isinf(b):
        return (math.isnan(a) and math.isnan(b)) or a == b
    return abs(a - b) <= 1e-12 * scale or (a == b == 0.0)


@pytest.mark.parametrize("zone", ["America/New_York", "Asia/Kolkata", "UTC"])
@pytest.mark.parametrize("seed", [1, 2])
def test_floating_point_sums_by_arrow_equal_spark_but_for_the_order_of_adding(spark, zone, seed):
    """SUM and AVG of FLOAT and DOUBLE over generated rows with every edge value: Arrow's
    fold gives Spark's groups, counts and NULLs exactly, the same NaN and infinities, and
    finite sums within the last bits of the terms' total (the order of adding differs)."""
    from process_zone import python_in_zone

    aggregate = _aggregate("SELECT k, COUNT(*) AS n, SUM(d) AS ds, AVG(f) AS fa, COUNT(d) AS dn FROM source GROUP BY k")
    schema = "id long, k long, d double, f float"
    upstream = [(i, k, d, f) for i, (k, d, f, _) in enumerate(_float_changes(seed + 100, 12, 60))]
    spark.createDataFrame(upstream, schema).createOrReplaceTempView("source")
    state = _held(spark, spark.sql(sql.state_sql(aggregate)))
    changes = _float_changes(seed, 12, 400)
    _held(spark, spark.createDataFrame(changes, "k long, d double, f float, __sign int")) \
        .createOrReplaceTempView(apply._CHANGES)
    with python_in_zone(zone):
        by_arrow = touched_in_driver(spark, aggregate, apply._CHANGES, state, None, frozenset())
        assert by_arrow is not None and is_local(by_arrow), "floating-point sums are folded by the driver"
        by_spark = apply._touched_by_spark(spark, aggregate, state, None, frozenset())
        assert by_arrow.schema == by_spark.schema
        arrow_rows = {row["__g0"]: row.asDict() for row in by_arrow.collect()}
        spark_rows = {row["__g0"]: row.asDict() for row in by_spark.collect()}
    assert arrow_rows.keys() == spark_rows.keys() and len(arrow_rows) == 12
    magnitude = {k: sum(abs(v) for v in values if v is not None and math.isfinite(v))
                 for k, values in ((k, [row[1] for row in changes if row[0] == k] +
                                    [row[2] for row in changes if row[0] == k]) for k in arrow_rows)}
    sums = [c for c in by_spark.columns if c.startswith("__s")]
    assert sums and [by_spark.schema[c].dataType.simpleString() for c in sums] == ["double", "double"]
    for k, expected in spark_rows.items():
        got = arrow_rows[k]
        for column, value in expected.items():
            if column in sums:
                assert _close(got[column], value, magnitude[k]), (k, column, got[column], value)
            else:
                assert got[column] == value or got[column] != got[column] and value != value, (k, column)
    assert arrow_rows[0][sums[0]] is None and math.copysign(1.0, arrow_rows[1][sums[0]]) == 1.0
    assert any(math.isnan(row[sums[0]]) for row in arrow_rows.values() if row[sums[0]] is not None)


@pytest.mark.parametrize("zone", ["America/New_York", "UTC"])
@pytest.mark.parametrize("seed", [3, 4])
def test_floating_point_minima_and_maxima_by_arrow_are_sparks(spark, zone, seed):
    """MIN and MAX of FLOAT and DOUBLE over rows with every edge value (NaN, which Spark
    orders above infinity; -0.0 and 0.0, equal; NULL): Arrow's fold gives Spark's."""
    from process_zone import python_in_zone

    aggregate = _aggregate("SELECT k, MIN(d) AS dmin, MAX(d) AS dmax, MIN(f) AS fmin, MAX(f) AS fmax, "
                           "COUNT(*) AS n FROM source GROUP BY k")
    spark.createDataFrame([(i, k, d, f) for i, (k, d, f, _) in enumerate(_float_changes(seed + 100, 12, 60))],
                          "id long, k long, d double, f float").createOrReplaceTempView("source")
    state = _held(spark, spark.sql(sql.state_sql(aggregate)))
    changes = [row[:3] + (1,) for row in _float_changes(seed, 12, 300)]  # arrivals: extremes combine exactly
    _held(spark, spark.createDataFrame(changes, "k long, d double, f float, __sign int")) \
        .createOrReplaceTempView(apply._CHANGES)
    with python_in_zone(zone):
        by_arrow = touched_in_driver(spark, aggregate, apply._CHANGES, state, None, frozenset())
        assert by_arrow is not None and is_local(by_arrow), "floating-point extremes are folded by the driver"
        by_spark = apply._touched_by_spark(spark, aggregate, state, None, frozenset())
        arrow_rows = {row["__g0"]: row.asDict() for row in by_arrow.collect()}
        spark_rows = {row["__g0"]: row.asDict() for row in by_spark.collect()}
    assert arrow_rows.keys() == spark_rows.keys() and len(arrow_rows) == 12
    nan_seen = False
    for k, expected in spark_rows.items():
        for column, value in expected.items():
            got = arrow_rows[k][column]
            if isinstance(value, float) and math.isnan(value):
                nan_seen = True
                assert isinstance(got, float) and math.isnan(got), (k, column, got)
            else:
                assert got == value, (k, column, got, value)  # -0.0 == 0.0, as Spark compares them
    assert nan_seen, "the rows hold NaN extremes"
