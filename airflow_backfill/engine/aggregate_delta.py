"""What one range of change rows adds to each group it touches: the range's delta.

Spark always evaluates the query's row-level parts (WHERE, GROUP BY keys, aggregate
arguments) over the signed change rows, so every value has Spark SQL's semantics. The
terms of a group are then combined (`aggregate_sql.delta_parts`: signed sums, MIN/MAX
of added and removed values) either

- on the driver, with Arrow, when that is exact for the types involved: integer,
  decimal, string, date, timestamp or boolean keys and extremes, integer, decimal or
  double sums. Integer sums are added as 38-digit decimals, so an overflow is an error
  as in Spark's ANSI mode, never a wrapped value. This is what a typical round does:
  Spark's projection of a local relation is folded while planning, whereas an
  aggregation costs a shuffle and its code generation, which for a few thousand change
  rows take far longer than the rows themselves;
- by Spark (`aggregate_sql.delta_sql`) otherwise: floating-point keys or MIN/MAX (NaN
  and -0.0 order and group differently in Arrow), other types, or a range of more than
  `DRIVER_COMBINE_ROWS` change rows, which Spark aggregates in parallel.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import pyarrow as pa

from airflow_backfill.engine import aggregate_sql as sql
from airflow_backfill.engine.changes import FEED_COLUMNS, signed_rows

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import DataType, StructType

    from airflow_backfill.engine.aggregate_query import AggregateQuery

DRIVER_COMBINE_ROWS = 500_000
"""Change rows up to which a range's terms are combined on the driver."""

CHANGES_VIEW = "__airflow_backfill_changes"
_EXCLUDED_RULES = "spark.sql.optimizer.excludedRules"
_FOLD_LOCAL_RELATION = "org.apache.spark.sql.catalyst.optimizer.ConvertToLocalRelation"


def range_delta(spark: SparkSession, aggregate: AggregateQuery, feed: pa.Table, state: StructType) -> pa.Table:
    """One row per group the change rows in `feed` touch (after WHERE): its keys and the
    columns of `delta_sql`. `state` is the state table's schema (it has the SUM types)."""
    referenced = sql.row_columns(aggregate)
    columns = [c for c in feed.column_names if c not in FEED_COLUMNS and c.lower() in referenced]
    rows = signed_rows(feed, columns)
    spark.createDataFrame(rows).createOrReplaceTempView(CHANGES_VIEW)
    types = {field.name: field.dataType for field in state.fields}
    with _compiled_row_expressions(spark):
        if rows.num_rows > DRIVER_COMBINE_ROWS or not _combinable_on_driver(aggregate, types):
            return spark.sql(sql.delta_sql(aggregate, CHANGES_VIEW)).toArrow()
        # Every summed delta column (__rows, __n<j>, __s<j>) is a state column of that type.
        sum_types = {column: types[column].simpleString() for column, _, combine in sql.delta_parts(aggregate)
                     if combine == "sum"}
        terms = spark.sql(sql.delta_terms_sql(aggregate, CHANGES_VIEW, sum_types)).toArrow()
    return _combine(aggregate, terms)


@contextmanager
def _compiled_row_expressions(spark: SparkSession) -> Iterator[None]:
    """Have Spark evaluate the change rows' expressions in a task, with generated code.

    The change rows are a local relation, which Spark's optimizer otherwise folds by
    interpreting every expression for every row while planning: for the decimal
    arithmetic of a few thousand rows that takes several times longer than the task.
    The session's setting is restored afterwards.
    """
    previous = spark.conf.get(_EXCLUDED_RULES, None)
    excluded = ",".join(filter(None, [previous, _FOLD_LOCAL_RELATION]))
    spark.conf.set(_EXCLUDED_RULES, excluded)
    try:
        yield
    finally:
        if previous is None:
            spark.conf.unset(_EXCLUDED_RULES)
        else:
            spark.conf.set(_EXCLUDED_RULES, previous)


def _combine(aggregate: AggregateQuery, terms: pa.Table) -> pa.Table:
    """Group the terms by key and combine each as `delta_parts` says, keeping their types."""
    keys = sql.key_columns(aggregate)
    parts = sql.delta_parts(aggregate)
    widened = terms
    for column, _, combine in parts:
        if combine == "sum" and pa.types.is_integer(terms.schema.field(column).type):
            index = widened.schema.get_field_index(column)
            widened = widened.set_column(index, column, widened[column].cast(pa.decimal128(38, 0)))
    combined = widened.group_by(keys, use_threads=False).aggregate(
        [(column, combine) for column, _, combine in parts]
    )
    names = {f"{column}_{combine}": column for column, _, combine in parts}
    combined = combined.rename_columns([names.get(name, name) for name in combined.column_names])
    target = pa.schema([terms.schema.field(name) for name in [*keys, *(column for column, _, _ in parts)]])
    return combined.select(target.names).cast(target)


def _combinable_on_driver(aggregate: AggregateQuery, state_types: dict[str, DataType]) -> bool:
    """True when Arrow combines the terms exactly as Spark would (see the module doc)."""
    from pyspark.sql.types import DecimalType, DoubleType, IntegralType

    keys = [state_types[column] for column in sql.key_columns(aggregate)]
    extremes = [state_types[column] for column in state_types if column.startswith(("__min", "__max"))]
    sums = [state_types[column] for column in state_types if column.startswith("__s")]
    return (
        all(_exactly_ordered(t) for t in [*keys, *extremes])
        and all(isinstance(t, IntegralType | DecimalType | DoubleType) for t in sums)
    )


def _exactly_ordered(data_type: DataType) -> bool:
    """Types that Arrow groups and orders exactly as Spark does."""
    from pyspark.sql.types import (
        BooleanType,
        DateType,
        DecimalType,
        IntegralType,
        StringType,
        TimestampNTZType,
        TimestampType,
    )

    if isinstance(data_type, StringType):  # a collation other than binary compares differently
        return getattr(data_type, "collation", "UTF8_BINARY") == "UTF8_BINARY"
    return isinstance(data_type, BooleanType | DateType | DecimalType | IntegralType | TimestampType | TimestampNTZType)
