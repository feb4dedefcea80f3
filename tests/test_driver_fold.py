"""A round's touched groups folded by Arrow equal Spark's fold of the same rows, and what
Arrow would not fold exactly as Spark does is left to Spark."""

from __future__ import annotations

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
    ("SELECT k, SUM(f) AS s FROM source GROUP BY k", SIGNED),  # a floating-point sum: Spark's order of adding
    ("SELECT f, COUNT(*) AS n FROM source GROUP BY f", SIGNED),  # a floating-point key: Spark groups NaN, -0.0
    ("SELECT k, COUNT(*) AS n FROM source GROUP BY k", [(None, Decimal("1.00"), 1, 0.0, 1)]),  # a NULL key
    ("SELECT k, SUM(id) AS s FROM source GROUP BY k", None),  # a sum that could overflow 64 bits
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
