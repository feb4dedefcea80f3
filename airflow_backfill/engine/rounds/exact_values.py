"""Values compared and grouped exactly, as a row of an MV must keep them.

Why: Spark's `<=>` and its GROUP BY equate values an MV row must keep apart (0.0 and
-0.0, strings equal under a case-blind collation), and Spark 4.2 groups a map (alone or
inside a struct) through a sorted copy that turns its NULL values of numeric types into
zeros: a round that nets whole rows by grouping them would write `{'b': 0}` for
`{'b': NULL}`. Comparisons go through `same_value`; groupings of whole rows through
`grouped_rows`, which groups by `grouping_value` (an exact, map-free stand-in of each
value) and carries the value itself through the aggregation. NaN equals NaN in both, as
in Spark's own comparisons and in the engine's netting.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from airflow_backfill.engine.planning.aggregate_sql import quote

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType


def same_value(left: Column, right: Column, data_type: DataType) -> Column:
    """True when `left` and `right` (both of `data_type`) hold the same value, NULL equal to
    NULL; never NULL. Exact where Spark's `<=>` is not: a floating-point 0.0 differs from
    -0.0, a collated string from one that differs in bytes, and nested values compare
    element by element (a map by its entries in key order). A variant, or a type Spark
    cannot compare, counts as differing: its row is written again."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, DoubleType, FloatType, MapType, StringType, StructType

    if _plain(data_type):
        return left.eqNullSafe(right)
    both_null, both_set = left.isNull() & right.isNull(), left.isNotNull() & right.isNotNull()
    if isinstance(data_type, (FloatType, DoubleType)):  # <=> already tells NaN and NULL apart from the rest
        zero_sign = F.coalesce(left != F.lit(0.0), F.lit(True)) | (left.cast("string") == right.cast("string"))
        return left.eqNullSafe(right) & zero_sign
    if isinstance(data_type, StringType):  # a collation that equates other bytes: compare the bytes
        return left.cast("binary").eqNullSafe(right.cast("binary"))
    if isinstance(data_type, StructType):
        fields = [same_value(left.getField(f.name), right.getField(f.name), f.dataType) for f in data_type.fields]
        return both_null | (both_set & all_of(fields))
    if isinstance(data_type, ArrayType):
        element = data_type.elementType
        pairs = F.zip_with(left, right, lambda x, y: same_value(x, y, element))
        return both_null | (both_set & (F.size(left) == F.size(right)) & F.forall(pairs, lambda same: same))
    if isinstance(data_type, MapType):
        entries = ArrayType(StructType().add("key", data_type.keyType).add("value", data_type.valueType))
        return both_null | (both_set & same_value(_entries_by_key(left), _entries_by_key(right), entries))
    return F.lit(False)


def _plain(data_type: DataType) -> bool:
    """Whether Spark's `<=>` compares values of `data_type` exactly."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        BooleanType,
        DateType,
        DayTimeIntervalType,
        DecimalType,
        IntegralType,
        NullType,
        StringType,
        StructType,
        TimestampNTZType,
        TimestampType,
        YearMonthIntervalType,
    )

    if isinstance(data_type, StringType):
        return getattr(data_type, "collation", "UTF8_BINARY") == "UTF8_BINARY"
    if isinstance(data_type, StructType):
        return all(_plain(field.dataType) for field in data_type.fields)
    if isinstance(data_type, ArrayType):
        return _plain(data_type.elementType)
    return isinstance(data_type, (BinaryType, BooleanType, DateType, DayTimeIntervalType, DecimalType, IntegralType,
                                  NullType, TimestampNTZType, TimestampType, YearMonthIntervalType))


def _entries_by_key(value: Column) -> Column:
    """A map's entries as an array sorted by key (keys are unique and never NULL)."""
    from pyspark.sql import functions as F

    def order(a: Column, b: Column) -> Column:
        return F.when(a.getField("key") < b.getField("key"), -1).when(a.getField("key") > b.getField("key"), 1) \
            .otherwise(0)

    return F.array_sort(F.map_entries(value), order)


def all_of(conditions: Sequence[Column]) -> Column:
    from pyspark.sql import functions as F

    result = F.lit(True)
    for condition in conditions:
        result = result & condition
    return result


def grouping_value(value: Column, data_type: DataType) -> Column:
    """A stand-in of `value` (of `data_type`) that Spark groups exactly: equal for two values
    exactly when `same_value` says they are the same. The value itself where Spark's
    grouping is exact; a float with the sign of its zero; a collated string's bytes; a map
    as its entries in key order; structs and arrays member by member."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, DoubleType, FloatType, MapType, StringType, StructType

    if _plain(data_type):
        return value
    if isinstance(data_type, (FloatType, DoubleType)):
        return F.struct(value.alias("v"), F.when(value == F.lit(0.0), value.cast("string")).alias("zero"))
    if isinstance(data_type, StringType):
        return value.cast("binary")
    if isinstance(data_type, StructType):
        members = [grouping_value(value.getField(f.name), f.dataType).alias(f.name) for f in data_type.fields]
        return F.when(value.isNotNull(), F.struct(*members))
    if isinstance(data_type, ArrayType):
        element = data_type.elementType
        return F.transform(value, lambda item: grouping_value(item, element))
    if isinstance(data_type, MapType):
        key_type, value_type = data_type.keyType, data_type.valueType
        return F.transform(_entries_by_key(value), lambda entry: F.struct(
            grouping_value(entry.getField("key"), key_type).alias("key"),
            grouping_value(entry.getField("value"), value_type).alias("value")))
    return value  # a variant: Spark refuses to group it, and says so


def grouped_rows(rows: DataFrame, columns: Sequence[str], aggregates: Mapping[str, Column]) -> DataFrame:
    """`rows` grouped by the whole value of `columns` (exactly: `grouping_value`), with
    `aggregates` (output name to aggregate) computed per group; the columns come out as
    they went in, then the aggregates. Columns Spark groups exactly are grouped as they
    are; each other one by its stand-in, the value carried by `first` (every row of a
    group holds the same)."""
    from pyspark.sql import functions as F

    types = {field.name: field.dataType for field in rows.schema.fields}
    keys, carried = [], []
    for number, name in enumerate(columns):
        column = F.col(quote(name))
        if _plain(types[name]):
            keys.append(column)
        else:
            keys.append(grouping_value(column, types[name]).alias(f"__group_{number}"))
            carried.append(F.first(column).alias(name))
    grouped = rows.groupBy(*keys).agg(*(column.alias(name) for name, column in aggregates.items()), *carried)
    return grouped.select(*(quote(name) for name in columns), *(quote(name) for name in aggregates))
