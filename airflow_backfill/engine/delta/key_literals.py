"""A few changed keys written out as a SQL condition of literals.

Why: a keyed replace or delete finds the table's rows of the changed keys with a
semi-join against the changes, which Spark plans as a broadcast join with its own
asynchronous jobs, a few tenths of a second however few the keys. When the driver holds a
handful of keys, the same rows are found by a plain filter (`l_orderkey = 7 AND
l_linenumber = 2 OR ...`): Parquet skips row groups with it, Delta skips files with it,
and Delta's `replaceWhere` deletes and appends in one commit without a join.

Only types whose literals are exact in SQL are written out (integers, decimals, dates,
booleans, strings without quotes or backslashes, which no parser setting can change);
any other key, or more than `sizes.literal_keys` keys, keeps the semi-join.
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_backfill.engine.sizes import sizes

if TYPE_CHECKING:
    from pyspark.sql.types import StructField

def keys_condition(keys: Sequence[Sequence[Any]], fields: Sequence[StructField], *, null_safe: bool) -> str | None:
    """A condition on the table's key `fields` that holds exactly for rows whose key is one
    of `keys` (compared with `<=>` when `null_safe`, else `=`); None when there are more
    than `sizes.literal_keys` keys or none, or a key value has no exact literal.

    Without `null_safe` a key with a NULL part matches no row, and a replace would still
    append its new row, which the condition would then not cover: such keys give None.
    """
    if not keys or len(keys) > sizes().literal_keys:
        return None
    terms = []
    for key in dict.fromkeys(tuple(key) for key in keys):
        parts = []
        for field, value in zip(fields, key, strict=True):
            column = "`" + field.name.replace("`", "``") + "`"
            if value is None:
                if not null_safe:
                    return None
                parts.append(f"{column} IS NULL")
                continue
            literal = _literal(value, field)
            if literal is None:
                return None
            parts.append(f"{column} = {literal}")
        terms.append("(" + " AND ".join(parts) + ")")
    return " OR ".join(terms)


def literal_types(fields: Sequence[StructField]) -> bool:
    """Whether every field is of a type `keys_condition` may write literals of."""
    from pyspark.sql.types import BooleanType, DateType, DecimalType, IntegralType, StringType

    return all(isinstance(field.dataType, (BooleanType, DateType, DecimalType, IntegralType, StringType))
               for field in fields)


def _literal(value: Any, field: StructField) -> str | None:
    """`value` as a SQL literal of `field`'s type, or None when it has no exact one."""
    from pyspark.sql.types import BooleanType, DateType, DecimalType, IntegralType, StringType

    kind = field.dataType
    if isinstance(kind, BooleanType) and isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(kind, IntegralType) and isinstance(value, int) and not isinstance(value, bool):
        return f"CAST({value} AS {kind.simpleString().upper()})"
    if isinstance(kind, DecimalType) and isinstance(value, (decimal.Decimal, int)) and decimal.Decimal(value).is_finite():
        return f"CAST('{value}' AS {kind.simpleString().upper()})"
    if isinstance(kind, DateType) and isinstance(value, datetime.date) and not isinstance(value, datetime.datetime):
        return f"DATE'{value.isoformat()}'"
    if isinstance(kind, StringType) and isinstance(value, str) and "'" not in value and "\\" not in value:
        return f"'{value}'"
    return None
