"""Literal key predicates: Spark parses them and they select exactly the listed keys,
whatever the key's type, NULLs and quotes; unbounded or inexact key sets get none."""

from __future__ import annotations

import datetime
import decimal

import pyarrow as pa
import pytest

from airflow_backfill.engine.delta import key_predicate as kp

pytestmark = pytest.mark.spark

SCHEMA = "a long, s string, d date, m decimal(10,2), f double"
ROWS = [
    (1, "x", datetime.date(2024, 1, 1), decimal.Decimal("1.50"), 0.5),
    (2, "it's", datetime.date(2024, 1, 2), decimal.Decimal("2.00"), 1.5),
    (3, "back\\slash", datetime.date(2024, 1, 3), None, 2.5),
    (None, "x", None, decimal.Decimal("3.25"), 3.5),
    (5, "\\'", datetime.date(2024, 2, 1), decimal.Decimal("4.00"), 4.5),
]


def selected(spark, columns: tuple[str, ...], keys: list[tuple]) -> list[tuple]:
    frame = spark.createDataFrame(ROWS, SCHEMA)
    table = pa.table({column: [key[i] for key in keys] for i, column in enumerate(columns)})
    predicate = kp.key_predicate(table, columns, frame.schema)
    assert predicate is not None
    return sorted((tuple(row[c] for c in columns) for row in frame.filter(predicate).collect()),
                  key=lambda key: tuple((v is not None, v) for v in key))


def test_single_and_composite_keys_select_exactly_their_rows(spark):
    assert selected(spark, ("a",), [(2,), (5,), (7,)]) == [(2,), (5,)]
    assert selected(spark, ("s",), [("it's",), ("back\\slash",), ("\\'",)]) == [("\\'",), ("back\\slash",), ("it's",)]
    assert selected(spark, ("d", "s"), [(datetime.date(2024, 1, 2), "it's"), (datetime.date(2024, 1, 1), "y")]) == [
        (datetime.date(2024, 1, 2), "it's")]
    assert selected(spark, ("m", "a"), [(decimal.Decimal("1.5"), 1), (decimal.Decimal("4"), 5)]) == [
        (decimal.Decimal("1.50"), 1), (decimal.Decimal("4.00"), 5)]


def test_null_keys_match_null(spark):
    assert selected(spark, ("a", "s"), [(None, "x"), (1, "x")]) == [(None, "x"), (1, "x")]
    assert selected(spark, ("m",), [(None,)]) == [(None,)]


def test_no_keys_select_nothing_and_inexact_or_too_many_keys_get_no_predicate(spark):
    frame = spark.createDataFrame(ROWS, SCHEMA)
    assert kp.key_predicate(pa.table({"a": pa.array([], pa.int64())}), ("a",), frame.schema) == "false"
    assert kp.key_predicate(pa.table({"f": [0.5]}), ("f",), frame.schema) is None
    too_many = pa.table({"a": list(range(kp.MAX_LITERAL_KEYS + 1))})
    assert kp.key_predicate(too_many, ("a",), frame.schema) is None
