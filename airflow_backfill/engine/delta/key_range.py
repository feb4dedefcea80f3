"""The key range of a round's changes, and what the target's file statistics say about it.

A MERGE whose condition only equates keys gives Delta's file skipping nothing to prune
with, so every round reads the keys of every file of the target, whatever it changes.
Two facts about the leading key column fix that, and both are cheap: the changes' own
range (one aggregate over rows already in memory) and the target's per-file minimum and
maximum (the log's statistics, read on the driver with delta-rs, no data). With them a
MERGE gets literal bounds Delta prunes files with, and a round whose keys all lie above
everything the target holds (new orders, new events) is a plain append.

Only integral and date keys get bounds: their statistics are exact and their literals
cannot be shifted by a time zone or truncated like long strings.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from airflow_backfill.engine.delta.driver_rows import local_arrow
from airflow_backfill.engine.delta.log import load_table, table_at

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType

_BOUNDABLE_TYPES = ("ByteType", "ShortType", "IntegerType", "LongType", "DateType")


@dataclass(frozen=True)
class KeyRange:
    """The leading key column's range over a round's changes."""

    column: str
    low: Any
    """The smallest non-NULL key (None when every key is NULL or there are no rows)."""
    high: Any
    has_nulls: bool
    present_rows: int
    """Rows that put a row in the table (the others delete their key)."""
    rows: int | None = None
    """Rows in all (one per changed key), when counted."""
    flagged_rows: int = 0
    """Rows whose boolean `flag` column is true, when `key_range` was given one."""

    def predicate(self, column: Column, data_type: DataType) -> Column:
        """A condition on the target's `column` that every target row a change matches meets.

        The bounds are literals of the column's own type, so Delta compares them with its
        file statistics directly (no cast of the column).
        """
        from pyspark.sql import functions as F

        condition = F.lit(False)
        if self.low is not None:
            condition = within_bounds(column, self.low, self.high, data_type)
        if self.has_nulls:
            condition = condition | column.isNull()
        return condition


def bound_literal(value: Any, data_type: DataType) -> Column:
    """A bound of a `boundable` key as a literal of `data_type`. A date is written as SQL's
    DATE literal: PySpark's own conversion of a date before the year 1000 fails (it writes
    the year without its leading zeros)."""
    from pyspark.sql import functions as F

    if isinstance(value, datetime.date) and not isinstance(value, datetime.datetime):
        return F.expr(f"DATE'{value.isoformat()}'").cast(data_type)
    return F.lit(value).cast(data_type)


def within_bounds(column: Column, low: Any, high: Any, data_type: DataType) -> Column:
    """`low <= column <= high`, with bounds written by `bound_literal`."""
    return (column >= bound_literal(low, data_type)) & (column <= bound_literal(high, data_type))


def boundable(data_type: DataType) -> bool:
    """True for key types whose file statistics and literals are exact."""
    return type(data_type).__name__ in _BOUNDABLE_TYPES


def key_range(changes: DataFrame, column: str, present: str, flag: str | None = None) -> KeyRange:
    """The range of `column` over `changes` (when its type is `boundable`: only those bounds
    are ever used), the count of rows with `present` set and, with `flag`, of rows whose
    `flag` is true (one job)."""
    from pyspark.sql import functions as F

    key = F.col(f"`{column}`")
    bounded = boundable(changes.schema[column].dataType)
    flagged = F.count(F.when(F.col(f"`{flag}`"), 1)) if flag is not None else F.lit(0)
    row = changes.agg(
        (F.min(key) if bounded else F.lit(None)).alias("low"), (F.max(key) if bounded else F.lit(None)).alias("high"),
        F.count(F.when(key.isNull(), 1)).alias("nulls"),
        F.count(F.col(f"`{present}`")).alias("present"), F.count(F.lit(1)).alias("rows"), flagged.alias("flagged"),
    ).collect()[0]
    return KeyRange(column, row["low"], row["high"], bool(row["nulls"]), int(row["present"]), int(row["rows"]),
                    int(row["flagged"]))


def changes_key_range(changes: DataFrame, column: str, present: str, flag: str | None = None,
                      only: str | None = None) -> KeyRange:
    """`key_range` of `changes` (of its rows whose boolean column `only` is true, when given):
    from the Arrow rows when the driver holds them as a local relation (no job, and no
    py4j for the aggregate's expressions: a tenth of a small round), else one Spark job."""
    from pyspark.sql import functions as F

    held = local_arrow(changes)
    if held is None:
        return key_range(changes if only is None else changes.filter(F.col(f"`{only}`")), column, present, flag)
    names = {name.lower(): name for name in held.column_names}
    if only is not None:
        held = held.filter(pc.fill_null(held.column(names[only.lower()]), False))
    found = key_range_of_table(held, names[column.lower()], names[present.lower()],
                               None if flag is None else names[flag.lower()])
    return replace(found, column=column)  # named as asked, as Spark's answer is


def key_range_of_table(rows: pa.Table, column: str, present: str, flag: str | None = None) -> KeyRange:
    """`key_range` of rows the driver holds as Arrow (`driver_rows`), computed here without a job."""
    keys = rows.column(column)
    bounds = pc.min_max(keys).as_py() if _arrow_boundable(keys.type) else {"min": None, "max": None}
    flagged = int(pc.sum(pc.fill_null(rows.column(flag), False).cast(pa.int64())).as_py() or 0) if flag else 0
    return KeyRange(column, bounds["min"], bounds["max"], keys.null_count > 0,
                    rows.num_rows - rows.column(present).null_count, rows.num_rows, flagged)


def _arrow_boundable(data_type: pa.DataType) -> bool:
    """The Arrow types of `boundable` Spark types: integers and dates."""
    return pa.types.is_integer(data_type) or pa.types.is_date32(data_type)


def table_rows(uri: str, version: int | None = None) -> int:
    """Rows of the table (as of `version`, default the latest) from its files' statistics:
    rows a deletion vector hides still count, so this is an upper bound."""
    table = table_at(uri, version)
    actions = pa.table(table.get_add_actions(flatten=True))
    if actions.num_rows == 0 or "num_records" not in actions.column_names:
        return 0
    return int(pc.sum(pc.fill_null(actions.column("num_records"), 0)).as_py() or 0)


def rows_in_range(uri: str, column: str, changes: KeyRange | None) -> tuple[int, int]:
    """(rows of the table, rows of its files whose `column` range meets the changes' range),
    from the files' statistics (no data read). Files without statistics, and every file
    when `changes` is None (a key without usable statistics) or has a NULL key, count as met."""
    actions = pa.table(load_table(uri).get_add_actions(flatten=True))
    if actions.num_rows == 0 or "num_records" not in actions.column_names:
        return 0, 0
    records = pc.fill_null(actions.column("num_records"), 0)
    total = int(pc.sum(records).as_py() or 0)
    low, high = f"min.{column}", f"max.{column}"
    if changes is not None and changes.low is None and not changes.has_nulls:
        return total, 0
    if changes is None or changes.has_nulls or not {low, high} <= set(actions.column_names):
        return total, total
    apart = pc.or_(pc.less(actions.column(high), pa.scalar(changes.low, actions.column(high).type)),
                   pc.greater(actions.column(low), pa.scalar(changes.high, actions.column(low).type)))
    met = pc.invert(pc.fill_null(apart, False))
    return total, int(pc.sum(pc.if_else(met, records, 0)).as_py() or 0)


def table_key_max(uri: str, column: str, version: int | None = None) -> Any:
    """The largest non-NULL value of `column` in the table at `uri` (as of `version`, default
    the latest), from its file statistics.

    Returns `EMPTY` for a table without rows, None when a file has no statistic for the
    column (an old file, a column beyond the statistics' columns): then nothing is known.
    """
    table = table_at(uri, version)
    actions = pa.table(table.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return EMPTY
    names = set(actions.column_names)
    maximum, nulls, records = f"max.{column}", f"null_count.{column}", "num_records"
    if maximum not in names or records not in names:
        return None
    values = actions.column(maximum)
    if values.null_count:
        # A file whose column is all NULL has no maximum and is harmless; any other gap is unknown.
        if nulls not in names:
            return None
        missing = pc.is_null(values)
        all_null = pc.equal(actions.column(nulls), actions.column(records))
        if not pc.all(pc.or_(pc.invert(missing), pc.fill_null(all_null, False))).as_py():
            return None
        if values.null_count == actions.num_rows:
            return EMPTY
    return pc.max(values).as_py()


def integer_key_ranges(actions: pa.Table, columns: Sequence[str]) -> list[tuple[int, int]] | None:
    """Per integer column of `columns`, the (lowest, highest) value of a table's files (their
    add actions, flattened), from their statistics; None when a column is not an integer
    one or some file has no statistic for it (then nothing is known)."""
    names = {name.lower(): name for name in actions.column_names}
    ranges = []
    for column in columns:
        low, high = names.get(f"min.{column}".lower()), names.get(f"max.{column}".lower())
        if low is None or high is None or not pa.types.is_integer(actions.schema.field(low).type):
            return None
        lows, highs = actions.column(low), actions.column(high)
        if lows.null_count or highs.null_count or not actions.num_rows:
            return None
        ranges.append((int(pc.min(lows).as_py()), int(pc.max(highs).as_py())))
    return ranges


class _Empty:
    def __repr__(self) -> str:
        return "EMPTY"


EMPTY: Any = _Empty()
"""`table_key_max` of a table with no non-NULL key: every key is above it."""


def all_above(changes: KeyRange, table_max: Any) -> bool:
    """True when no key of the changes can be in the table: each lies above its maximum."""
    if changes.has_nulls or table_max is None:
        return False
    return table_max is EMPTY or changes.low is None or changes.low > table_max
