"""The rows of a Delta table whose columns equal one of a few keys, read by the driver.

Why: a join round extends each table's changed rows with the rows the other tables hold
at the same join keys. Spark reads those through Delta: planning each scan runs Delta's
file skipping and deletion-vector lookups as jobs, and again whenever the plan holding
it is cached, persisted or collected (about 1.5 s of a TPC-H Q3 round at SF 1 that looks
up a few thousand keys, docs/benchmarks.md). The keys are few, so the driver reads the
matching rows itself: the table's files as of the version from its log (delta-rs), those
whose statistics of the first key column leave room for some key, in those the row
groups whose statistics do, then the key column of each and, where it holds a key, the
other columns. Row groups are read one at a time, so the driver holds one row group's
key column and the matches.

Only tables without the deletion-vectors reader feature are read here (a data file's
rows are then all live; delta-rs does not report which files carry a vector). Anything
else returns None and the caller reads through Spark: too many keys or matches, a key
type other than integers, strings, dates and decimals, files too large to scan.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_backfill.engine.delta.arrow_types import arrow_schema_of
from airflow_backfill.engine.delta.log import delta_table, spark_schema
from airflow_backfill.engine.sizes import sizes
from airflow_backfill.storage import files
from airflow_backfill.storage.uri import join

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

def lookup_rows(uri: str, version: int, columns: Sequence[str], key_columns: Sequence[str],
                keys: pa.Table) -> tuple[pa.Table, StructType] | None:
    """The rows of the table at `uri` as of `version` whose `key_columns` equal a row of
    `keys` (same order; NULL never equals), as Arrow of the table's `columns` and their
    Spark schema, or None when the driver does not read them (see the module's docstring)."""
    import pyarrow as pa
    from pyspark.sql.types import StructType

    table = delta_table(uri, version)
    if "deletionVectors" in set(table.protocol().reader_features or []) or table.metadata().partition_columns:
        return None
    keys = keys.drop_null()
    if keys.num_rows > sizes().lookup_keys:
        return None
    schema = spark_schema(table)
    names = {name.lower(): name for name in schema.names}
    if any(c.lower() not in names for c in [*columns, *key_columns]):
        return None
    columns = [names[c.lower()] for c in columns]
    key_columns = [names[c.lower()] for c in key_columns]
    wanted_schema = StructType([next(f for f in schema.fields if f.name == c) for c in columns])
    target = _arrow_types(wanted_schema, columns)
    key_types = _arrow_types(schema, key_columns)
    if target is None or key_types is None or not all(_searchable(f.type) for f in key_types):
        return None
    try:
        wanted = pa.table([keys.column(i).cast(f.type) for i, f in enumerate(key_types)], schema=key_types)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    first = wanted.column(0).unique().sort()
    paths = _candidate_files(uri, table, key_columns[0], first.to_pylist()) if len(first) else []
    found = None if paths is None else _matching_rows(paths, columns, key_columns, wanted, first)
    if found is None:
        return None
    try:
        rows = [pa.table([part.column(c).cast(f.type) for c, f in zip(columns, target, strict=True)], schema=target)
                for part in found]
    except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
        log.info("lookup in %s left to Spark: %s", uri, error)
        return None
    return (pa.concat_tables(rows) if rows else target.empty_table()), wanted_schema


def _arrow_types(schema: StructType, columns: Sequence[str]) -> pa.Schema | None:
    """The Arrow schema Spark's local relation takes for `columns`, or None when Arrow
    cannot carry one of their types."""
    from pyspark.errors import PySparkException
    from pyspark.sql.types import StructType

    fields = {field.name: field for field in schema.fields}
    try:
        return arrow_schema_of(StructType([fields[c] for c in columns]))
    except (PySparkException, TypeError):
        return None


def _searchable(data_type: pa.DataType) -> bool:
    """Types whose statistics and values compare exactly in Python (no time zones, no NaN)."""
    import pyarrow as pa

    return (pa.types.is_integer(data_type) or pa.types.is_string(data_type) or pa.types.is_date32(data_type)
            or pa.types.is_decimal(data_type))


def _meets(sorted_keys: list[Any], low: Any, high: Any) -> bool:
    """Whether some key lies in [low, high] (an unknown bound meets every key)."""
    if low is None or high is None:
        return True
    at = bisect.bisect_left(sorted_keys, low)
    return at < len(sorted_keys) and sorted_keys[at] <= high


def _candidate_files(uri: str, table: Any, column: str, sorted_keys: list[Any]) -> list[str] | None:
    """The data files whose statistics of `column` leave room for some key; None when
    they hold more than `sizes.scan_rows` rows."""
    import pyarrow as pa

    actions = pa.table(table.get_add_actions(flatten=True))
    names = set(actions.column_names)
    low, high = f"min.{column}", f"max.{column}"
    bounded = low in names and high in names
    rows = actions.column("num_records").to_pylist() if "num_records" in names else [None] * actions.num_rows
    paths, scanned = [], 0
    for n, path in enumerate(actions.column("path").to_pylist()):
        try:
            if bounded and not _meets(sorted_keys, actions.column(low)[n].as_py(), actions.column(high)[n].as_py()):
                continue
        except TypeError:  # statistics of another type than the keys
            return None
        counted = rows[n]
        scanned += sizes().scan_rows + 1 if counted is None else int(counted)  # a file without statistics: not scanned here
        if scanned > sizes().scan_rows:
            log.info("lookup in %s left to Spark: more than %s rows to scan", uri, sizes().scan_rows)
            return None
        paths.append(path if "://" in path or path.startswith("/") else join(uri, path))
    return paths


def _matching_rows(paths: list[str], columns: list[str], key_columns: list[str], wanted: pa.Table,
                   first: pa.Array) -> list[pa.Table] | None:
    """The files' rows whose keys are in `wanted`, row group by row group; None beyond
    `sizes.lookup_rows`."""
    import pyarrow as pa
    import pyarrow.compute as pc

    sorted_keys = first.to_pylist()
    read = list(dict.fromkeys([*columns, *key_columns]))
    parts, held = [], 0
    for path in paths:
        with files.parquet_file(path) as parquet:
            position = parquet.schema_arrow.get_field_index(key_columns[0])
            if position < 0 or any(parquet.schema_arrow.get_field_index(c) < 0 for c in read):
                return None  # a file written before a column was added: Spark fills it in
            for group in range(parquet.num_row_groups):
                statistics = parquet.metadata.row_group(group).column(position).statistics
                try:
                    if statistics is not None and statistics.has_min_max and not _meets(
                            sorted_keys, statistics.min, statistics.max):
                        continue
                except TypeError:
                    return None
                key = _without_views(parquet.read_row_group(group, columns=[key_columns[0]])).column(0)
                try:
                    mask = pc.is_in(key, value_set=first.cast(key.type))
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    return None
                if not pc.any(mask).as_py():
                    continue
                rows = _without_views(parquet.read_row_group(group, columns=read)).filter(mask)
                if len(key_columns) > 1:
                    rows = _semi_join(rows, key_columns, wanted)
                    if rows is None:
                        return None
                held += rows.num_rows
                if held > sizes().lookup_rows:
                    return None
                parts.append(rows)
    return parts


def _semi_join(rows: pa.Table, key_columns: list[str], wanted: pa.Table) -> pa.Table | None:
    """`rows` whose key columns equal a row of `wanted` (all columns, not the first alone)."""
    import pyarrow as pa

    renamed = [f"__key{n}" for n in range(len(key_columns))]
    try:
        keys = pa.table([wanted.column(n).cast(rows.schema.field(c).type) for n, c in enumerate(key_columns)],
                        names=renamed)
        return rows.join(keys.group_by(renamed).aggregate([]), keys=key_columns, right_keys=renamed,
                         join_type="left semi")
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def _without_views(rows: pa.Table) -> pa.Table:
    """`rows` with string and binary view columns (as delta-rs writes some files) cast to
    plain strings and binaries, which Arrow's filters and joins take."""
    import pyarrow as pa

    plain = {pa.string_view(): pa.string(), pa.binary_view(): pa.binary()}
    if not any(field.type in plain for field in rows.schema):
        return rows
    return rows.cast(pa.schema([field.with_type(plain.get(field.type, field.type)) for field in rows.schema]))
