"""A few keys written out as a SQL condition of literals: exact types only, NULLs only when
compared null-safely, at most `sizes.literal_keys` keys."""

from __future__ import annotations

import datetime
from decimal import Decimal

from pyspark.sql.types import (
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    TimestampType,
)

from airflow_backfill.engine.delta.key_literals import keys_condition
from airflow_backfill.engine.sizes import sizes

ID, DAY = StructField("id", LongType()), StructField("day", DateType())


def test_keys_of_exact_types_become_one_term_each_and_repeats_once():
    fields = [ID, DAY, StructField("name", StringType()), StructField("price", DecimalType(10, 2)),
              StructField("ok", BooleanType()), StructField("n", IntegerType())]
    key = (7, datetime.date(2024, 1, 31), "a b", Decimal("1.50"), True, -3)
    condition = keys_condition([key, key, (8, *key[1:])], fields, null_safe=False)
    assert condition == (
        "(`id` = CAST(7 AS BIGINT) AND `day` = DATE'2024-01-31' AND `name` = 'a b' AND `price` = "
        "CAST('1.50' AS DECIMAL(10,2)) AND `ok` = TRUE AND `n` = CAST(-3 AS INT)) OR "
        "(`id` = CAST(8 AS BIGINT) AND `day` = DATE'2024-01-31' AND `name` = 'a b' AND `price` = "
        "CAST('1.50' AS DECIMAL(10,2)) AND `ok` = TRUE AND `n` = CAST(-3 AS INT))")


def test_a_null_part_is_written_only_when_compared_null_safely():
    assert keys_condition([(None, datetime.date(2024, 1, 1))], [ID, DAY], null_safe=True) == (
        "(`id` IS NULL AND `day` = DATE'2024-01-01')")
    assert keys_condition([(None, datetime.date(2024, 1, 1))], [ID, DAY], null_safe=False) is None


def test_values_without_an_exact_literal_and_too_many_keys_give_none():
    name = StructField("name", StringType())
    assert keys_condition([("it's",)], [name], null_safe=False) is None
    assert keys_condition([("a\\b",)], [name], null_safe=False) is None
    assert keys_condition([(1.5,)], [StructField("x", DoubleType())], null_safe=False) is None
    assert keys_condition([(datetime.datetime(2024, 1, 1),)], [StructField("t", TimestampType())],
                          null_safe=False) is None
    assert keys_condition([(True,)], [ID], null_safe=False) is None  # a bool is no BIGINT
    assert keys_condition([], [ID], null_safe=False) is None
    assert keys_condition([(k,) for k in range(sizes().literal_keys + 1)], [ID], null_safe=False) is None
    assert keys_condition([(k,) for k in range(sizes().literal_keys)], [ID], null_safe=False) is not None


def test_a_column_name_with_a_backtick_is_quoted():
    assert keys_condition([(1,)], [StructField("a`b", LongType())], null_safe=False) == "(`a``b` = CAST(1 AS BIGINT))"
