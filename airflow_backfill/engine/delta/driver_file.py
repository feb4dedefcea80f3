"""A small table's whole new content written as one Parquet file by the driver, for an
overwrite that delta-spark then commits.

An aggregate's state and a small MV are overwritten whole each round from rows the
driver already holds (`driver_rows`). Spark's write of them ships the rows to the JVM as a
local relation and runs a job for one small file: 0.2 - 0.3 s a table at TPC-H SF 1, where
pyarrow writes the same file in milliseconds. Only the files are the driver's (the data
file, and the change file that keeps the table's feed to the rows that changed,
`overwrite_feed`): the commit is delta-spark's transaction, with its conflict checks, as
for every write.

The file's statistics are the ones Delta's readers skip files by and the engine counts
rows and bounds keys by: `numRecords`, `nullCount` of every column, and `minValues` /
`maxValues` of the columns whose order Arrow and Spark agree on exactly (integers, dates,
decimals, and strings of at most 32 characters, Delta's prefix length). Other columns get
no bounds, which every reader takes as unknown (no file skipped on them).
"""

from __future__ import annotations

import datetime
import decimal
import json
import time
import uuid
from typing import TYPE_CHECKING, Any

from airflow_backfill.storage import files
from airflow_backfill.storage.uri import join

if TYPE_CHECKING:
    import pyarrow as pa

STRING_BOUND_CHARS = 32
"""Delta's `dataSkippingStringPrefixLength`: longer strings get no bounds here."""
CHANGE_DATA_FOLDER = "_change_data"
"""Where Delta keeps a table's change files."""


def writable(table: pa.Table) -> bool:
    """Whether every column is of a type this module writes and describes (flat columns of
    numbers, strings, booleans, dates, decimals and timestamps)."""
    import pyarrow as pa

    return all(
        pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t) or pa.types.is_boolean(t)
        or pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_date32(t)
        or pa.types.is_timestamp(t)
        for t in table.schema.types
    )


def _bounded(data_type: pa.DataType) -> bool:
    import pyarrow as pa

    return (pa.types.is_integer(data_type) or pa.types.is_decimal(data_type) or pa.types.is_date32(data_type)
            or pa.types.is_string(data_type) or pa.types.is_large_string(data_type))


def _json_value(value: Any) -> str:
    """A bound as Delta writes it: numbers as JSON numbers (decimals exactly), dates and
    strings as JSON strings."""
    if isinstance(value, bool):
        raise TypeError("booleans get no bounds")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, decimal.Decimal):
        return format(value, "f")
    if isinstance(value, datetime.date):
        return json.dumps(value.isoformat())
    return json.dumps(value)


def statistics(table: pa.Table) -> str:
    """The Delta statistics (the add action's `stats`) of a file holding `table`."""
    import pyarrow.compute as pc

    lows: list[str] = []
    highs: list[str] = []
    nulls: list[str] = []
    for name, column in zip(table.column_names, table.columns, strict=True):
        key = json.dumps(name)
        nulls.append(f"{key}:{column.null_count}")
        if not _bounded(column.type) or column.null_count == len(column):
            continue
        bounds = pc.min_max(column)
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
        if isinstance(low, str) and max(len(low), len(high)) > STRING_BOUND_CHARS:
            continue
        lows.append(f"{key}:{_json_value(low)}")
        highs.append(f"{key}:{_json_value(high)}")
    return (f'{{"numRecords":{table.num_rows},"minValues":{{{",".join(lows)}}},'
            f'"maxValues":{{{",".join(highs)}}},"nullCount":{{{",".join(nulls)}}},"tightBounds":true}}')


def write_file(uri: str, table: pa.Table, *, data_change: bool = True,
               row_group_rows: int | None = None) -> dict[str, Any]:
    """Write `table` as a new Parquet file in the table folder `uri`; its add action (the
    `add` of a Delta commit, as a dict). `data_change` false for a rewrite of rows the
    table holds already (a compaction); `row_group_rows`: the most rows of a row group
    (None: Arrow's bound)."""
    name = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
    return {"path": name, "partitionValues": {}, "size": _write_parquet(join(uri, name), table, row_group_rows),
            "modificationTime": int(time.time() * 1000), "dataChange": data_change, "stats": statistics(table)}


def write_change_file(uri: str, changes: pa.Table) -> dict[str, Any]:
    """Write `changes` (the table's columns and `_change_type`) as a change file of the
    table folder `uri`; its `cdc` action. Why: a commit that holds change files is read by
    change-feed readers (Delta's, and the engine's) from them alone, so an overwrite of a
    small table whole shows its readers the rows that changed, not every row deleted and
    inserted again."""
    name = f"{CHANGE_DATA_FOLDER}/cdc-00000-{uuid.uuid4()}.c000.snappy.parquet"
    return {"path": name, "partitionValues": {}, "size": _write_parquet(join(uri, name), changes),
            "dataChange": False}


def _write_parquet(uri: str, table: pa.Table, row_group_rows: int | None = None) -> int:
    """Write `table` as one Parquet file at `uri`; its size in bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="snappy", row_group_size=row_group_rows)
    content = sink.getvalue().to_pybytes()
    files.write_bytes(uri, content)
    return len(content)
