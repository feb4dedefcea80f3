"""A stateless join round's keyed changes worked out by Arrow equal Spark's, and what
Arrow would not count exactly as Spark does is left to Spark (which names a repeated key)."""

from __future__ import annotations

import datetime
from decimal import Decimal
from types import SimpleNamespace

import pytest
from float_bits import exact_rows

from airflow_backfill.engine.delta.commits import repeated_key_named
from airflow_backfill.engine.delta.driver_rows import is_local, local_relation
from airflow_backfill.engine.joins import apply as join_apply
from airflow_backfill.engine.joins.driver_keyed import keyed_changes_in_driver
from airflow_backfill.engine.rounds.changes import apply_query

pytestmark = pytest.mark.spark

PLAN = SimpleNamespace(flat=SimpleNamespace(query="SELECT k, line, v + v AS amount, d FROM source WHERE line > 0"),
                       mv_key=("k", "line"))
SIGNED = "k long, line int, v decimal(10,2), d date, __sign int"
MV = "k long, line int, amount decimal(11,2), d date, __sign int"
def D(day: int) -> datetime.date:  # noqa: N802 - a short name keeps the rows readable
    return datetime.date(2020, 1, day)


ROWS = [
    (1, 1, Decimal("1.50"), D(1), 1),  # key (1, 1) arrives with a new row ...
    (1, 1, Decimal("1.00"), D(1), -1),  # ... replacing its old one
    (2, 1, Decimal("3.00"), D(2), 1), (2, 1, Decimal("3.00"), D(2), -1),  # nets to nothing
    (3, 1, Decimal("4.00"), None, 1),  # a new key, a NULL value
    (4, 0, Decimal("9.00"), D(3), 1),  # filtered out by WHERE
    (6, 2, Decimal("2.00"), D(4), -1),  # a key that leaves
]
LEAVING = [(5, 1, Decimal("8.00"), D(5), -1), (3, 1, Decimal("7.00"), D(5), -1)]


def _local(spark, rows, schema):
    frame = spark.createDataFrame(rows, schema)
    local = local_relation(spark, frame.toArrow(), frame.schema)
    assert local is not None
    return local


def _sorted(frame):
    return sorted((tuple(row) for row in frame.collect()), key=repr)


def test_keyed_changes_by_arrow_equal_spark(spark):
    signed, leaving = _local(spark, ROWS, SIGNED), _local(spark, LEAVING, MV)
    mapped = apply_query(spark, signed, join_apply.signed_query(PLAN.flat.query))
    by_arrow = keyed_changes_in_driver(mapped, leaving, PLAN.mv_key)
    assert by_arrow is not None and is_local(by_arrow)
    cached = [signed.cache(), leaving.cache()]  # cached frames are not local: Spark's own way
    try:
        by_spark = join_apply.keyed_changes(spark, PLAN, *cached)
        assert by_arrow.schema == by_spark.schema
        assert _sorted(by_arrow) == _sorted(by_spark)
    finally:
        for frame in cached:  # a cached plan would stand for equal local relations of the tests after
            frame.unpersist()
    assert {(row["k"], row["__present"]) for row in by_arrow.collect()} == {(1, True), (3, True), (5, None), (6, None)}


TYPED_SIGNED = "k timestamp, line int, x double, y float, at timestamp, wall timestamp_ntz, __sign int"
TYPED_QUERY = "SELECT k, line, x, y, at, wall, x * 2 AS x2 FROM source"
NAN = float("nan")
UTC = datetime.UTC


def _instant(*parts: int) -> datetime.datetime:
    return datetime.datetime(*parts, tzinfo=UTC)


TYPED_ROWS = [
    (_instant(2024, 3, 10, 7, 0), 1, 0.0, -0.0, _instant(1850, 1, 1, 12), datetime.datetime(2024, 3, 10, 2, 30), -1),
    (_instant(2024, 3, 10, 7, 0), 1, -0.0, -0.0, _instant(1850, 1, 1, 12), datetime.datetime(2024, 3, 10, 2, 30), 1),
    (_instant(2024, 11, 3, 5, 30), 1, NAN, NAN, None, None, -1),  # a NaN for a NaN: the same row
    (_instant(2024, 11, 3, 5, 30), 1, NAN, NAN, None, None, 1),
    (_instant(2024, 11, 3, 6, 30), 2, float("inf"), None, _instant(2024, 11, 3, 5, 30), None, 1),
    (_instant(1883, 11, 18, 17, 0), 2, 5e-324, 1.5, _instant(2024, 3, 10, 7), datetime.datetime(1, 1, 1), -1),
]


@pytest.mark.parametrize("zone", ["America/New_York", "Asia/Kolkata", "UTC"])
def test_keyed_changes_of_floats_and_timestamps_by_arrow_equal_spark(spark, zone):
    """Floats keep the sign of their zero and every NaN is one value, timestamps (the MV
    key among them) are instants: counted by Arrow as Spark counts them, whatever the
    time zone of the process."""
    from process_zone import python_in_zone

    plan = SimpleNamespace(flat=SimpleNamespace(query=TYPED_QUERY), mv_key=("k", "line"))
    with python_in_zone(zone):
        signed = _local(spark, TYPED_ROWS, TYPED_SIGNED)
        mapped = apply_query(spark, signed, join_apply.signed_query(TYPED_QUERY))
        by_arrow = keyed_changes_in_driver(mapped, None, plan.mv_key)
        assert by_arrow is not None and is_local(by_arrow)
        cached = signed.cache()
        try:
            by_spark = join_apply.keyed_changes(spark, plan, cached)
            assert by_arrow.schema == by_spark.schema
            exact = exact_rows(by_spark)
            assert exact_rows(by_arrow) == exact
        finally:
            cached.unpersist()
    assert {(row[1], row[2], row[-1]) for row in exact} == {
        (1, "8000000000000000", True),  # 0.0 became -0.0: the key's row changed
        (2, "7ff0000000000000", True), (2, "0000000000000001", None)}  # the NaN row netted away


@pytest.mark.parametrize("case", ["repeated key", "NULL key", "floating key", "leaving typed otherwise"])
def test_what_arrow_would_not_count_as_spark_does_is_left_to_spark(spark, case):
    rows, leaving, query = list(ROWS), _local(spark, LEAVING, MV), PLAN.flat.query
    if case == "repeated key":
        rows.append((1, 1, Decimal("5.00"), D(1), 1))
    elif case == "NULL key":
        rows.append((None, 1, Decimal("5.00"), D(1), 1))
    elif case == "floating key":
        query = "SELECT CAST(k AS DOUBLE) AS k, line, v AS amount, d FROM source"
        leaving = None
    else:
        leaving = _local(spark, [(5, 1, 8, D(5), -1)], "k long, line int, amount long, d date, __sign int")
    mapped = apply_query(spark, _local(spark, rows, SIGNED), join_apply.signed_query(query))
    assert keyed_changes_in_driver(mapped, leaving, PLAN.mv_key) is None


def test_a_repeated_key_is_named_by_spark(spark):
    rows = [*ROWS, (1, 1, Decimal("5.00"), D(1), 1)]
    with pytest.raises(Exception) as raised:
        join_apply.keyed_changes(spark, PLAN, _local(spark, rows, SIGNED)).collect()
    assert repeated_key_named(raised.value) == "k=1, line=1"
