"""Bring a small Spark result to the driver as an Arrow table, without a Spark job when
Spark has already computed it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

COLLECTED_ROWS = 10_000
"""Result rows up to which a result is collected as rows rather than as Arrow batches."""


def small_result_to_arrow(frame: DataFrame, rows: int) -> pa.Table:
    """`frame`'s rows (`rows` of them, as the caller knows) as an Arrow table.

    A projection of a local relation is computed while Spark plans it, and collecting
    its rows runs no job, whereas `toArrow` always runs one: for the few rows of an
    aggregate round that job is most of the cost. Types that Python rows do not carry
    faithfully (timestamps become local times; nested and binary values) and larger
    results go through `toArrow`.
    """
    from pyspark.sql.pandas.types import to_arrow_schema

    schema = to_arrow_schema(frame.schema)
    if rows > COLLECTED_ROWS or not all(_carried_by_rows(field.type) for field in schema):
        return frame.toArrow()
    columns = list(zip(*frame.collect(), strict=True)) or [() for _ in schema]
    return pa.table([pa.array(values, field.type) for values, field in zip(columns, schema, strict=True)],
                    schema=schema)


def _carried_by_rows(data_type: pa.DataType) -> bool:
    return (
        pa.types.is_integer(data_type) or pa.types.is_floating(data_type) or pa.types.is_decimal(data_type)
        or pa.types.is_boolean(data_type) or pa.types.is_string(data_type)
        or pa.types.is_large_string(data_type) or pa.types.is_date32(data_type)
    )
