"""The live rows of a Delta table version whose key equals one of some keys, found by the
driver with their files and row positions.

Why: a round asks which rows hold its changed keys, of its MV (to mark them deleted and
to feed their old images) and of its upstream (to prove an added key is held once). Spark
answers with a scan of every file the keys' range meets and a join, a second or more;
the keys are few, so the driver answers: the files whose statistics of the first key
column leave room for some key, in those the row groups whose statistics do, then the key
columns of each and, where they hold a key, the other columns wanted. Deletion vectors are
applied (`deletion_vectors`), so any table reads here, whoever wrote it. Costs follow the
files the keys meet: keys clustered in a key range read a few files, scattered keys the
key columns of most of them (a few milliseconds per million integer keys).

Statistics prune only for keys whose bounds compare exactly in Python (integers, strings,
dates, decimals); other key types read every file's key columns. None (the caller asks
Spark) beyond `sizes.lookup_keys` keys, `sizes.scan_rows` key values to read or
`sizes.lookup_rows` matches, for key types Arrow does not compare as Spark does, or for a
layout this module does not read (partition values, mapped column names).
"""

from __future__ import annotations

import bisect
import datetime
import decimal
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_backfill.engine.delta.deletion_vectors import deleted_rows
from airflow_backfill.engine.delta.key_lookup import comparable_key, contains
from airflow_backfill.engine.delta.row_positions import RowSelection, read_selected
from airflow_backfill.engine.sizes import sizes
from airflow_backfill.storage import files

if TYPE_CHECKING:
    from airflow_backfill.engine.delta.log_state import LiveFile, TableState

log = logging.getLogger(__name__)

FILE, POSITION = "__file", "__position"
"""Columns of `FoundRows.rows`: the index of the row's file in `FoundRows.files`, and the
row's position in that file."""


@dataclass(frozen=True)
class FoundRows:
    """The live rows holding some key, and where they are."""

    rows: pa.Table
    """The wanted columns (as the table spells them) plus `__file` and `__position`."""
    files: list[LiveFile]
    """The files that hold at least one of the rows."""
    scanned: int
    """Key values read to find them."""
    version: int
    """The table's version they were found at."""


def find_rows(state: TableState, key_columns: Sequence[str], keys: pa.Table, columns: Sequence[str] = (), *,
              null_safe: bool = False, most_rows: int | None = None) -> FoundRows | None:
    """The live rows of `state` whose `key_columns` equal a row of `keys` (same order; NULL
    equals NULL only when `null_safe`), with `columns` besides the key (as the table spells
    them), or None when the driver does not read them (see the module's text) or they are
    more than `most_rows` (default `lookup_rows`; the search stops at the first row over)."""
    if not state.plain_layout:
        return None
    if not null_safe:
        keys = keys.drop_null()
    if keys.num_rows > sizes().lookup_keys:
        return None
    if not all(comparable_key(keys.schema.field(i).type) for i in range(keys.num_columns)):
        return None
    keys = keys.rename_columns(list(key_columns))
    wanted = list(dict.fromkeys([*key_columns, *columns]))
    first = keys.column(0)
    candidates = _candidate_files(state.files, key_columns[0], first)
    if candidates is None:
        return None
    if sum(sizes().scan_rows + 1 if live.records is None else live.records for live in candidates) > sizes().scan_rows:
        log.info("lookup in %s left to Spark: more than %s rows in the files the keys meet", state.uri,
                 sizes().scan_rows)
        return None
    parts: list[pa.Table] = []
    touched: list[LiveFile] = []
    scanned = found = 0
    limit = sizes().lookup_rows if most_rows is None else most_rows
    for live in candidates:
        rows, read = _file_rows(state.uri, live, key_columns, keys, wanted, null_safe)
        if rows is None:
            return None
        scanned += read
        if rows.num_rows:
            found += rows.num_rows
            if found > limit:
                log.info("lookup in %s left to Spark: more than %s matching rows", state.uri, limit)
                return None
            parts.append(rows.append_column(FILE, pa.array(np.full(rows.num_rows, len(touched), np.int32))))
            touched.append(live)
    if not parts:
        return FoundRows(_empty(state, wanted), [], scanned, state.version)
    try:
        table = pa.concat_tables(parts, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None
    return FoundRows(table, touched, scanned, state.version)


def rows_at(found: FoundRows, columns: Sequence[str]) -> pa.Table | None:
    """`columns` of the rows `found` points at (its `__file` and `__position`), read from
    the row groups holding them; None when a file lacks a column. Why apart from
    `find_rows`: a caller that has the rows' old images from elsewhere (a stateless MV's
    query over the feed's first images) needs only where they are, and reading every
    column of every touched row group costs what those groups hold."""
    parts = []
    for index, live in enumerate(found.files):
        mine = found.rows.filter(pc.equal(found.rows.column(FILE), index))
        if not mine.num_rows:
            continue
        rows = read_selected(live.uri, list(columns), RowSelection.at(np.unique(mine.column(POSITION).to_numpy())))
        if any(column not in rows.column_names for column in columns):
            return None
        parts.append(_plain(rows.select(list(columns))))
    if not parts:
        return None if found.rows.num_rows else pa.table({})
    try:
        return pa.concat_tables(parts, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None


def _empty(state: TableState, wanted: list[str]) -> pa.Table:
    from pyspark.sql.types import StructType

    from airflow_backfill.engine.delta.arrow_types import arrow_schema_of

    schema = arrow_schema_of(StructType.fromJson(json.loads(state.metadata["schemaString"])))
    fields = [schema.field(name) for name in wanted]
    return pa.schema([*fields, pa.field(POSITION, pa.int64()), pa.field(FILE, pa.int32())]).empty_table()


def _bound(value: Any, kind: pa.DataType) -> Any:
    """A statistics value (as the log's JSON gives it) comparable with keys of `kind`, or
    None when such keys are not pruned by statistics."""
    if value is None:
        return None
    if pa.types.is_integer(kind) and isinstance(value, int) and not isinstance(value, bool):
        return value
    if pa.types.is_decimal(kind) and isinstance(value, (int, decimal.Decimal)):
        return decimal.Decimal(value)
    if (pa.types.is_string(kind) or pa.types.is_large_string(kind)) and isinstance(value, str):
        return value
    if pa.types.is_date32(kind) and isinstance(value, str):
        try:
            return datetime.date.fromisoformat(value)
        except ValueError:
            return None
    return None


def _candidate_files(live_files: list[LiveFile], column: str, first: pa.ChunkedArray) -> list[LiveFile] | None:
    """The files whose statistics of `column` leave room for some value of `first`."""
    kind = first.type
    values = first.drop_null().unique()
    has_null = first.null_count > 0
    try:
        sorted_values = values.sort().to_pylist()
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
        return None
    if pa.types.is_decimal(kind):
        sorted_values = [decimal.Decimal(value) for value in sorted_values]
    candidates = []
    for live in live_files:
        stats = live.stats
        if live.records == 0:
            continue
        nulls = (stats.get("nullCount") or {}).get(column)
        if has_null and nulls != 0:
            candidates.append(live)
            continue
        low = _bound((stats.get("minValues") or {}).get(column), kind)
        high = _bound((stats.get("maxValues") or {}).get(column), kind)
        if low is None or high is None:
            if nulls is not None and live.records is not None and nulls == live.records:
                continue  # every value NULL: no non-NULL key is here
            if sorted_values or has_null:
                candidates.append(live)
            continue
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            high = high + "\U0010ffff"  # a bound may be a truncated prefix
        at = bisect.bisect_left(sorted_values, low)
        if at < len(sorted_values) and sorted_values[at] <= high:
            candidates.append(live)
    return candidates


def _file_rows(table_uri: str, live: LiveFile, key_columns: Sequence[str], keys: pa.Table, wanted: list[str],
               null_safe: bool) -> tuple[pa.Table | None, int]:
    """The file's live rows holding some key (the `wanted` columns and their positions),
    row group by row group; (None, 0) when a column is missing or a type does not compare."""
    deleted = deleted_rows(table_uri, live.deletion_vector)
    values = keys.column(0).drop_null().unique()
    sorted_values: list[Any] | None = None
    parts, read = [], 0
    with files.parquet_file(live.uri) as parquet:
        names = parquet.schema_arrow.names
        if any(column not in names for column in wanted):
            return None, 0
        position = names.index(key_columns[0])
        start = 0
        for group in range(parquet.num_row_groups):
            group_rows = parquet.metadata.row_group(group).num_rows
            group_start, start = start, start + group_rows
            statistics = parquet.metadata.row_group(group).column(position).statistics
            if statistics is not None and statistics.has_min_max and not (null_safe and keys.column(0).null_count):
                if sorted_values is None:
                    sorted_values = values.sort().to_pylist()
                try:
                    at = bisect.bisect_left(sorted_values, statistics.min)
                    if at >= len(sorted_values) or sorted_values[at] > statistics.max:
                        continue
                except TypeError:
                    pass  # statistics of another Python type: read the group
            key_rows = _key_columns(parquet, live.uri, group, key_columns)
            read += group_rows
            local = _matching(key_rows, key_columns, keys, null_safe)
            if local is None:
                return None, 0
            if not len(local):
                continue
            positions = local.astype(np.int64) + group_start
            if len(deleted):
                alive = ~np.isin(positions.astype(np.uint64), deleted)
                local, positions = local[alive], positions[alive]
                if not len(local):
                    continue
            rows = key_rows if wanted == list(key_columns) else _plain(
                parquet.read_row_group(group, columns=wanted))
            rows = rows.take(pa.array(local)).select(wanted)
            parts.append(rows.append_column(POSITION, pa.array(positions, pa.int64())))
        if not parts:
            empty = _plain(parquet.schema_arrow.empty_table().select(wanted))
            return empty.append_column(POSITION, pa.array([], pa.int64())), read
    return pa.concat_tables(parts), read


_key_cache: OrderedDict[tuple[str, int, tuple[str, ...]], pa.Table] = OrderedDict()
_key_cache_bytes = 0
_key_cache_lock = threading.Lock()


def _key_columns(parquet: Any, uri: str, group: int, key_columns: Sequence[str]) -> pa.Table:
    """A row group's key columns, kept per process up to `sizes.key_cache_bytes` (least
    recently used first out). Why: a data file never changes once written, and the rounds
    of the MVs over one upstream look the same files' keys up again and again (an
    upstream's key check, each MV's own rows): kept, a round reads only the files written
    since, what changed."""
    global _key_cache_bytes
    cache_key = (uri, group, tuple(key_columns))
    with _key_cache_lock:
        kept = _key_cache.get(cache_key)
        if kept is not None:
            _key_cache.move_to_end(cache_key)
            return kept
    rows = _plain(parquet.read_row_group(group, columns=list(key_columns)))
    limit = sizes().key_cache_bytes
    if rows.nbytes > limit:
        return rows
    with _key_cache_lock:
        if cache_key not in _key_cache:
            _key_cache[cache_key] = rows
            _key_cache_bytes += rows.nbytes
        while _key_cache_bytes > limit and _key_cache:
            _, dropped = _key_cache.popitem(last=False)
            _key_cache_bytes -= dropped.nbytes
    return rows


def _matching(key_rows: pa.Table, key_columns: Sequence[str], keys: pa.Table, null_safe: bool) -> np.ndarray | None:
    """The positions of `key_rows` whose key equals a row of `keys`: the first column by a
    hash lookup of its values (a pass over the rows), the other columns only over the rows
    it leaves; None when a type does not compare."""
    try:
        typed = pa.table([keys.column(i).cast(key_rows.schema.field(name).type)
                          for i, name in enumerate(key_columns)], names=list(key_columns))
        first, wanted = key_rows.column(0), typed.column(0)
        mask = pc.fill_null(pc.is_in(first, value_set=wanted.drop_null().unique()), False)
        if null_safe and wanted.null_count:
            mask = pc.or_(mask, pc.is_null(first))
        local = np.flatnonzero(mask.to_numpy(zero_copy_only=False))
        if len(key_columns) > 1 and len(local):
            candidates = key_rows.take(pa.array(local))
            matched = contains(candidates, key_columns, typed, key_columns)
            if not null_safe:
                for name in key_columns:
                    matched = pc.and_(matched, pc.is_valid(candidates.column(name)))
            local = local[matched.to_numpy(zero_copy_only=False)]
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    return local


def _plain(rows: pa.Table) -> pa.Table:
    """`rows` with string and binary view columns (as delta-rs writes some files) cast to
    plain strings and binaries, which Arrow's filters and joins take."""
    plain = {pa.string_view(): pa.string(), pa.binary_view(): pa.binary()}
    if not any(field.type in plain for field in rows.schema):
        return rows
    return rows.cast(pa.schema([field.with_type(plain.get(field.type, field.type)) for field in rows.schema]))
