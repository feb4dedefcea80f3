"""A literal Spark SQL predicate that matches exactly a bounded set of keys.

Delta replaces rows in one commit with `replaceWhere`: a DELETE of the rows matching a
predicate (deletion vectors, Parquet pushdown, file skipping on literal bounds) plus an
append. The predicate cannot name a DataFrame, so a round that replaces a set of keys
spells them out as literals. That costs driver memory and parsing in proportion to the
keys, so the set is bounded (`MAX_LITERAL_KEYS`) and larger rounds take another plan.

Only key types whose literals are exact are rendered (integers, dates, strings,
booleans, decimals); floating-point and timestamp keys (NaN, -0.0, time zones) make
`key_predicate` return None and the round take another plan.
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import DataType, StructType

MAX_LITERAL_KEYS = 200_000
"""Most keys a predicate spells out: about 10 MB of SQL text at worst, parsed in about a
second (docs/benchmarks.md); above it a round merges or recomputes instead."""

_INTEGER_SUFFIX = {"ByteType": "Y", "ShortType": "S", "IntegerType": "", "LongType": "L"}


def quote(column: str) -> str:
    return "`" + column.replace("`", "``") + "`"


def renderable(data_type: DataType) -> bool:
    """Whether keys of this Spark type can be written as exact literals."""
    name = type(data_type).__name__
    return name in _INTEGER_SUFFIX or name in ("DateType", "StringType", "BooleanType", "DecimalType")


def literal(value: Any, data_type: DataType) -> str:
    """`value` as a Spark SQL literal of exactly `data_type` (never NULL: callers test it)."""
    name = type(data_type).__name__
    if name in _INTEGER_SUFFIX:
        return f"{int(value)}{_INTEGER_SUFFIX[name]}"
    if name == "DateType":
        if not isinstance(value, datetime.date):
            raise TypeError(f"expected a date, got {value!r}")
        return f"DATE'{value.isoformat()}'"
    if name == "StringType":
        return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"
    if name == "BooleanType":
        return "true" if value else "false"
    if name == "DecimalType":
        exact = decimal.Decimal(value)
        return f"CAST('{exact}' AS {data_type.simpleString().upper()})"
    raise TypeError(f"no exact literal for {data_type.simpleString()}")


def key_predicate(keys: pa.Table, columns: Sequence[str], schema: StructType) -> str | None:
    """A predicate true exactly for the rows of a table whose `columns` equal one of the
    rows of `keys` (NULL equal to NULL); None when a key type has no exact literal or
    there are more than `MAX_LITERAL_KEYS` keys.

    Keys without NULLs go into one IN list (a hash set once Spark optimises it), a
    leading range in front of it lets Delta skip the files outside the keys' range; keys
    with a NULL are spelled out with `<=>`.
    """
    types = [_field_type(schema, column) for column in columns]
    if keys.num_rows > MAX_LITERAL_KEYS or not all(renderable(t) for t in types):
        return None
    if keys.num_rows == 0:
        return "false"
    values = [keys.column(index).to_pylist() for index in range(len(columns))]
    rows = list(zip(*values, strict=True))
    complete = [row for row in rows if None not in row]
    with_nulls = [row for row in rows if None in row]
    terms: list[str] = []
    if complete:
        terms.append(_in_list(complete, columns, types))
    terms += [_null_safe_row(row, columns, types) for row in with_nulls]
    return " OR ".join(f"({term})" for term in terms)


def _field_type(schema: StructType, column: str) -> DataType:
    for field in schema.fields:
        if field.name.lower() == column.lower():
            return field.dataType
    raise KeyError(f"column {column} is not in the table's schema")


def _in_list(rows: list[tuple[Any, ...]], columns: Sequence[str], types: list[DataType]) -> str:
    """`key IN (...)`, behind the leading column's literal bounds for file skipping."""
    leading = [row[0] for row in rows]
    bounds = (f"{quote(columns[0])} BETWEEN {literal(min(leading), types[0])} "
              f"AND {literal(max(leading), types[0])}")
    if len(columns) == 1:
        items = ",".join(literal(row[0], types[0]) for row in rows)
        return f"{bounds} AND {quote(columns[0])} IN ({items})"
    # A tuple literal is a struct with fields col1, col2...: the column side is named alike.
    fields = ", ".join(f"'col{index + 1}', {quote(column)}" for index, column in enumerate(columns))
    items = ",".join("(" + ",".join(literal(v, t) for v, t in zip(row, types, strict=True)) + ")" for row in rows)
    return f"{bounds} AND named_struct({fields}) IN ({items})"


def _null_safe_row(row: tuple[Any, ...], columns: Sequence[str], types: list[DataType]) -> str:
    return " AND ".join(
        f"{quote(column)} IS NULL" if value is None else f"{quote(column)} = {literal(value, data_type)}"
        for column, value, data_type in zip(columns, row, types, strict=True)
    )
