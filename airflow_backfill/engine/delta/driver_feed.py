"""A small change feed read by the driver from its files, as a Spark local relation.

Why: Spark's change feed reader costs a round 0.8 - 1 s whatever it carries (Delta's
change-feed relation, its planning, a job to cache the rows and one to count them),
where the line items of an RF1 + RF2 pair (12 k rows in two files) take 0.06 s to read
with Arrow. A range whose log shows it is small and of a shape the driver reads is read
here:

- a commit with change files (`cdc` actions: DELETE, UPDATE, MERGE, and the engine's own
  overwrites of tables the driver holds, `overwrite_feed`) is read from them alone, as
  Delta's reader does;
- a commit without change files (a blind append, a DELETE with deletion vectors, a whole
  file removed) is read from its data files, only the rows Delta's reader derives from
  them and their vectors (`vector_changes`): for a vector's new marks, only the row
  groups that hold them (`row_positions`).

Anything else (partition values or column mapping, vectors Delta's reader compares in
ways the driver does not, more rows than the limit, a column type Arrow cannot carry) is
left to Spark's reader, which handles every case.

A recompute that proves the upstream's key from the feed asks less of a larger range:
whether some key gained rows (`key_gained_rows`), from the key columns alone, summed
file by file: 1.2 M change rows of two integer keys are a few tens of MB, where Spark
took 2 s to read and shuffle them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from airflow_backfill.engine.delta.arrow_types import arrow_schema_of
from airflow_backfill.engine.delta.change_feed import (
    ARRIVING,
    CHANGE_TYPE,
    COMMIT_VERSION,
    check_range_readable,
)
from airflow_backfill.engine.delta.driver_rows import local_relation
from airflow_backfill.engine.delta.log import commit_actions, load_table, spark_schema
from airflow_backfill.engine.delta.row_positions import (
    RowSelection,
    bytes_read,
    groups_holding,
    read_selected,
    selected_batches,
)
from airflow_backfill.engine.delta.vector_changes import INSERT, FileChange, commit_file_changes
from airflow_backfill.engine.sizes import sizes
from airflow_backfill.storage import files
from airflow_backfill.storage.uri import join

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class HeldFeed:
    """A range's change rows held by the driver, with what the round asks of them."""

    frame: DataFrame
    """The upstream's requested columns plus `_change_type` and `_commit_version` (a
    local relation: filters, projections and collects over it run no Spark job)."""
    rows: int
    arriving: int
    """Rows that bring a row in (inserts and post-images)."""
    upstream: StructType
    """The upstream's columns, all of them, as Spark types."""
    table: pa.Table
    """The same rows as `frame`, as Arrow."""


@dataclass(frozen=True)
class ChangeFile:
    """One file a range's change rows are read from: a change file (`is_cdc`, with a
    `_change_type` column), or a data file whose `selection` of rows are all of
    `change_type` (an appended file's rows, a removed file's, a vector's new marks)."""

    uri: str
    version: int
    rows: int
    """Change rows read from the file."""
    is_cdc: bool
    change_type: str = INSERT
    """The change type of a data file's rows."""
    selection: RowSelection | None = None
    """A data file's rows that changed; None: every row."""

    @classmethod
    def of_data_file(cls, change: FileChange, version: int) -> ChangeFile:
        return cls(change.uri, version, change.rows, False, change.change_type, change.selection)


def feed_in_driver(
    spark: SparkSession, source: str, watermark: int, end_version: int, columns: list[str] | None = None,
    *, limit: int | None = None,
) -> HeldFeed | None:
    """The change rows of versions (watermark, end_version] (the upstream's `columns`, all
    when None), or None when the range is not small or not of a shape the driver reads
    (see the module's text): then the caller reads it with Spark. The range is checked as
    Spark's reader is checked first (`check_range_readable`): the files its feed is read
    from must exist. `limit`: the most change rows (default `sizes.feed_rows`)."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    limit = sizes().feed_rows if limit is None else limit

    upstream = range_schema(source, end_version)
    if upstream is None:
        return None
    change_files = range_files(source, watermark, end_version, limit)
    if change_files is None:
        return None
    wanted = [field.name for field in upstream.fields] if columns is None else list(columns)
    fields = {field.name: field for field in upstream.fields}
    schema = StructType([fields[name] for name in wanted]
                        + [StructField(CHANGE_TYPE, StringType()), StructField(COMMIT_VERSION, LongType())])
    table = _read(change_files, wanted, schema)
    if table is None:
        return None
    frame = local_relation(spark, table, schema)
    if frame is None:
        return None
    arriving = sum(1 for change in table.column(CHANGE_TYPE).to_pylist() if change in ARRIVING)
    log.info("change feed of versions %s..%s read by the driver: %s rows from %s files",
             watermark + 1, end_version, table.num_rows, len(change_files))
    return HeldFeed(frame, table.num_rows, arriving, upstream, table)


def key_gained_rows(source: str, watermark: int, end_version: int, key: Sequence[str]) -> bool | None:
    """Whether versions (watermark, end_version] leave some `key` with more rows than they
    found it with (its change rows' signs sum above zero), from the change files' key
    columns read by the driver; None when the range is not of the shape the driver reads
    or holds more than `sizes.key_feed_rows` rows (the caller asks Spark).

    The files are read in batches, each summed per key, and only keys whose running sum is
    not zero are kept: an update's pre-image and post-image cancel, so a range of updates
    holds next to nothing however many rows it changed."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_type

    upstream = range_schema(source, end_version)
    if upstream is None:
        return None
    change_files = range_files(source, watermark, end_version, sizes().key_feed_rows, max_bytes=sizes().key_feed_bytes)
    if change_files is None:
        return None
    fields = {field.name: field for field in upstream.fields}
    try:
        types = [to_arrow_type(fields[column].dataType) for column in key]
    except (KeyError, TypeError) as error:
        log.info("key check left to Spark: %s", error)
        return None
    sums = _KeySums(len(key))
    for change in change_files:
        wanted = [*key, CHANGE_TYPE] if change.is_cdc else list(key)
        if set(wanted) - set(files.parquet_metadata(change.uri).schema.names):
            return None
        for batch in selected_batches(change.uri, wanted, change.selection, batch_rows=_KEY_BATCH_ROWS,
                                      dictionary=[CHANGE_TYPE] if change.is_cdc else ()):
            try:
                columns = [batch.column(column).cast(kind) for column, kind in zip(key, types, strict=True)]
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                return None
            sums.add(columns, batch.column(CHANGE_TYPE) if change.is_cdc else change.change_type)
    gained = sums.any_gained()
    log.info("key columns of versions %s..%s read by the driver: %s change rows, %s keys with rows gained or "
             "lost", watermark + 1, end_version, sum(change.rows for change in change_files), sums.kept)
    return gained


@dataclass(frozen=True)
class ChangeKeyRange:
    """A key column's range over a range's change rows, read from the footers of the files
    they are read from."""

    low: Any
    """The lowest non-NULL value or less (None when every value is NULL)."""
    high: Any
    """The highest non-NULL value or more."""
    has_nulls: bool
    """Whether some change row may hold NULL."""
    rows: int
    """The change rows (a change file's rows, a data file's changed rows)."""


def change_key_range(source: str, watermark: int, end_version: int, column: str) -> ChangeKeyRange | None:
    """`column`'s range over the change rows of versions (watermark, end_version], from the
    statistics in the footers of the files they are read from (no rows read): a change
    file's, or those of the row groups of a data file that hold its changed rows (then
    bounds that may be wider than the rows'). None when a version has a shape the driver
    does not read (`range_files`), the range has no change rows or more than
    `sizes.range_files` files, a file has no statistics for the column, or a file is gone
    (the feed's reader then says the upstream was vacuumed). What the planner needs
    before the feed to know which of the MV's files a round must read."""
    try:
        read = _range_footers(source, watermark, end_version)
        if read is None:
            return None
        bounds, rows = [], 0
        for uri, selection, changed in read:
            footer = files.parquet_metadata(uri)
            groups = range(footer.num_row_groups) if selection is None else groups_holding(footer, selection)
            bound = None if groups is None else _column_bounds(footer, column, groups)
            if bound is None:
                return None
            bounds.append(bound)
            rows += footer.num_rows if changed is None else changed
    except FileNotFoundError:
        return None
    if not bounds:
        return None
    return ChangeKeyRange(min((low for low, _, _ in bounds if low is not None), default=None),
                          max((high for _, high, _ in bounds if high is not None), default=None),
                          any(nulls for _, _, nulls in bounds), rows)


def _range_footers(source: str, watermark: int, end_version: int
                   ) -> list[tuple[str, RowSelection | None, int | None]] | None:
    """Each file a range's change rows are read from, its rows that changed (None: all) and
    how many (None: the file's rows); None for a shape the driver does not read, or more
    than `sizes.range_files` files."""
    read: list[tuple[str, RowSelection | None, int | None]] = []
    for version in range(watermark + 1, end_version + 1):
        actions = commit_actions(source, version)
        cdc = [join(source, unquote(action["cdc"]["path"])) for action in actions if "cdc" in action]
        changes = [] if cdc else commit_file_changes(source, actions)
        if changes is None:
            return None
        read += [(uri, None, None) for uri in cdc]
        read += [(change.uri, change.selection, change.rows) for change in changes]
        if len(read) > sizes().range_files:
            return None
    return read


def _column_bounds(metadata: Any, column: str, groups: Iterable[int]) -> tuple[Any, Any, bool] | None:
    """(lowest, highest, any NULL) of a top-level `column` over a file's row `groups` from
    their statistics (lowest and highest None when every value is NULL); None when a
    row group has none."""
    names = [metadata.schema.column(i).path.lower() for i in range(metadata.num_columns)]
    if column.lower() not in names:
        return None
    index = names.index(column.lower())
    lows, highs, nulls = [], [], False
    for group in groups:
        statistics = metadata.row_group(group).column(index).statistics
        if statistics is None or not statistics.has_null_count:
            return None
        nulls = nulls or statistics.null_count > 0
        if statistics.has_min_max:
            lows.append(statistics.min)
            highs.append(statistics.max)
        elif statistics.null_count < metadata.row_group(group).num_rows:
            return None
    return min(lows, default=None), max(highs, default=None), nulls


_KEY_BATCH_ROWS = 1 << 12
"""Rows of a change file read and summed at once: with Arrow's allocator keeping what it
once held, larger batches raised the driver's peak by 50 - 95 MiB for 1.2 M change rows,
these by 24 MiB (0.2 s)."""


class _KeySums:
    """Per key, the sum of its change rows' signs, for the keys where it is not zero."""

    _SIGN = "__sign"

    def __init__(self, key_columns: int) -> None:
        self._names = [f"__key{i}" for i in range(key_columns)]
        self._parts: list[pa.Table] = []
        self._part_rows = 0
        self.kept = 0

    def add(self, columns: list[pa.Array], change_types: pa.Array | str) -> None:
        """One batch, with each row's change type, or the one type of them all (a data
        file's rows)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        if isinstance(change_types, str):
            signs = pa.array([1 if change_types in ARRIVING else -1] * len(columns[0]), pa.int64())
        else:
            signs = pc.if_else(pc.is_in(change_types.cast(pa.string()), value_set=pa.array(ARRIVING)), 1, -1)
        self._append(self._summed(pa.table([*columns, signs.cast(pa.int64())], names=[*self._names, self._SIGN])))
        if self._part_rows > max(4 * _KEY_BATCH_ROWS, 2 * self.kept):  # compacted at most O(log n) times per key
            self._compact()

    def any_gained(self) -> bool:
        import pyarrow.compute as pc

        self._compact()
        return any(bool(pc.any(pc.greater(part.column(self._SIGN), 0)).as_py()) for part in self._parts)

    def _summed(self, table: pa.Table) -> pa.Table:
        import pyarrow.compute as pc

        summed = table.group_by(self._names).aggregate([(self._SIGN, "sum")]).rename_columns(
            [*self._names, self._SIGN])
        return summed.filter(pc.not_equal(summed.column(self._SIGN), 0))

    def _append(self, part: pa.Table) -> None:
        self._parts.append(part)
        self._part_rows += part.num_rows

    def _compact(self) -> None:
        import pyarrow as pa

        if len(self._parts) > 1:
            self._parts = [self._summed(pa.concat_tables(self._parts))]
        self._part_rows = self.kept = sum(part.num_rows for part in self._parts)


def range_schema(source: str, end_version: int) -> StructType | None:
    """The upstream's Spark schema as of `end_version` from its Delta metadata (no JVM
    call); None for partition columns or column mapping, whose files do not hold the
    logical columns as named."""
    table = load_table(source)
    if any("metaData" in action for version in range(end_version + 1, table.version() + 1)
           for action in commit_actions(source, version)):
        return None  # the latest metadata is not the range's
    metadata = table.metadata()
    mapping = metadata.configuration.get("delta.columnMapping.mode", "none")
    if metadata.partition_columns or mapping not in ("none", None):
        return None
    return spark_schema(table)


def range_files(source: str, watermark: int, end_version: int, limit: int, max_bytes: int | None = None, *,
                in_part: bool = True) -> list[ChangeFile] | None:
    """The files each version's change rows are read from, or None when a version has a
    shape left to Spark, or the range holds more than `limit` change rows or reads more
    than `max_bytes` (default `sizes.feed_bytes`): files read whole count their logged
    size (before any footer is opened), files of which a vector names a few rows the row
    groups that hold them. `in_part`: whether data files read in part (a vector's rows, or
    the rows a vector leaves) are taken; else their range is left to Spark. The range is
    checked first as Spark's reader checks it (`check_range_readable`): a vacuumed file is
    the error that says so, not a footer that failed to open."""
    check_range_readable(source, watermark, end_version)
    max_bytes = sizes().feed_bytes if max_bytes is None else max_bytes
    found: list[ChangeFile] = []
    read_bytes = rows = 0
    for version in range(watermark + 1, end_version + 1):
        actions = commit_actions(source, version)
        cdc = [action["cdc"] for action in actions if "cdc" in action]
        changes = [] if cdc else commit_file_changes(source, actions)
        if changes is None or not in_part and any(change.selection is not None for change in changes):
            return None
        read_bytes += sum(int(entry.get("size") or 0) for entry in cdc)
        read_bytes += sum(change.size for change in changes if not _marks_only(change.selection))
        if read_bytes > max_bytes:
            return None
        in_version = [ChangeFile(uri, version, _parquet_rows(uri), True)
                      for uri in (join(source, unquote(entry["path"])) for entry in cdc)]
        in_version += [ChangeFile.of_data_file(change, version) for change in changes]
        rows += sum(change.rows for change in in_version)
        if rows > limit:
            return None
        marked = _marked_bytes(in_version)
        if marked is None or read_bytes + marked > max_bytes:
            return None
        read_bytes += marked
        found += in_version
    return found


def _marks_only(selection: RowSelection | None) -> bool:
    """A data file's few rows a vector names, read from the row groups that hold them."""
    return selection is not None and not selection.inverted


def _marked_bytes(change_files: list[ChangeFile]) -> int | None:
    """The bytes of the row groups that hold the files' rows named by vectors (from their
    footers); None when a vector names rows its file does not have."""
    total = 0
    for change in change_files:
        selection = change.selection
        if selection is None or selection.inverted:
            continue
        metadata = files.parquet_metadata(change.uri)
        groups = groups_holding(metadata, selection)
        if groups is None:
            log.info("change feed left to Spark: %s has fewer rows than its deletion vector names", change.uri)
            return None
        total += bytes_read(metadata, groups)
    return total


def _parquet_rows(uri: str) -> int:
    return files.parquet_metadata(uri).num_rows


def _read(change_files: list[ChangeFile], columns: list[str], schema: StructType) -> pa.Table | None:
    """The files' rows as one Arrow table of `schema`, or None when Arrow cannot carry a
    column's type as Spark expects it."""
    import pyarrow as pa
    from pyspark.errors import PySparkException

    try:
        target = arrow_schema_of(schema)
    except (PySparkException, TypeError) as error:
        log.info("change feed left to Spark: Arrow cannot carry its types (%s)", error)
        return None
    parts = []
    for change in change_files:
        wanted = [*columns, CHANGE_TYPE] if change.is_cdc else columns
        read = read_selected(change.uri, wanted, change.selection)
        if set(wanted) - set(read.column_names):  # e.g. a file written before a column was added
            log.info("change feed left to Spark: %s lacks some of %s", change.uri, wanted)
            return None
        kinds = read.column(CHANGE_TYPE) if change.is_cdc else pa.array([change.change_type] * read.num_rows)
        arrays = [*(read.column(name) for name in columns), kinds, pa.array([change.version] * read.num_rows)]
        try:
            parts.append(pa.table([array.cast(field.type) for array, field in zip(arrays, target, strict=True)],
                                  schema=target))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
            log.info("change feed left to Spark: %s cannot be cast to the table's types (%s)", change.uri, error)
            return None
    return pa.concat_tables(parts) if parts else target.empty_table()
