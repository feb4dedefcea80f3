"""Compaction of a table that rounds patch, read, written and committed by the driver.

Why: each round that patches an MV appends one small file of new rows and marks the rows
it replaced in deletion vectors (`patch_actions`); fifty MVs committing every second add
thousands of files an hour, and every reader pays per file: Spark's scans, the driver's
lookups by key (`keyed_rows`), the log and the file list of each checksum. When more than
`sizes.compact_files` live files are smaller than `sizes.small_file_bytes`, the driver
reads their live rows (deletion vectors applied), sorts them by the table's key, writes
them as files of at most `sizes.mv_file_rows` rows (`driver_file`, with statistics) and
commits the removal of the small files and the addition of the new ones. Files whose
vectors hide more than `sizes.rewrite_deleted_share` of their rows are rewritten with
them while the rows read stay within `sizes.compact_bytes`; larger ones are left (and
named) for `maintenance.maintain_mv`, whose OPTIMIZE and REORG run on Spark.

Nothing a reader sees changes. Every action is `dataChange: false`, so change-feed
readers skip the commit; it records no app transaction, so the watermark stays; and it is
Delta's own transaction, counting the whole table as read, so a concurrent commit that
removes or rewrites any file fails it and nothing is lost (its new files are never
referenced; VACUUM removes them). A concurrent append commits beside it: Delta checks a
commit that changes no row at snapshot isolation, as it does its own OPTIMIZE, and the
appended file is not one the compaction removes. Tables whose
files carry more than their rows are left as they are: partitioned, with mapped column
names, row tracking or clustering, or with a column type the driver does not write.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from airflow_backfill.engine.delta import commit_fence
from airflow_backfill.engine.delta.deletion_vectors import deleted_rows
from airflow_backfill.engine.delta.driver_file import writable, write_file
from airflow_backfill.engine.delta.log import still_newest
from airflow_backfill.engine.delta.log_state import LiveFile, TableState, table_state
from airflow_backfill.engine.delta.patch_actions import removal
from airflow_backfill.engine.internals import DeltaTransaction, is_commit_conflict, snapshot_version
from airflow_backfill.engine.sizes import sizes
from airflow_backfill.storage import files
from airflow_backfill.storage.lease import confirm_held, ensure_held

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

REWRITTEN_FEATURES = frozenset({"rowTracking", "clustering", "columnMapping", "icebergCompatV1",
                                "icebergCompatV2", "icebergCompatV3", "typeWidening", "typeWidening-preview"})
"""Table features whose files carry more than their rows (row ids, clustering, physical
names, narrower types): a rewrite from rows alone would lose it."""


@dataclass(frozen=True)
class Selection:
    """The live files one compaction rewrites, and those it leaves."""

    small: tuple[LiveFile, ...]
    """Files under `small_file_bytes`, when more than `compact_files` of them are live."""
    hidden: tuple[LiveFile, ...]
    """Larger files whose vectors hide more than `rewrite_deleted_share` of their rows."""
    left: tuple[LiveFile, ...]
    """Such files larger than the driver's budget (`compact_bytes`): OPTIMIZE's or REORG's."""

    @property
    def files(self) -> tuple[LiveFile, ...]:
        return self.small + self.hidden


@dataclass(frozen=True)
class Compaction:
    """What one compaction committed."""

    version: int
    removed: int
    added: int
    rows: int
    bytes_read: int
    left: tuple[str, ...]
    """Files whose vectors hide many rows, too large for the driver (their paths)."""


def compact_if_needed(spark: SparkSession, uri: str, key: Sequence[str]) -> bool:
    """Compact the table at `uri` (sorted by its `key` columns) when its small files or
    files mostly hidden by deletion vectors call for it; True when a compaction was
    committed. Meant for the end of a round, under the MV's writer lock: a table that
    moved meanwhile, or a commit that a concurrent one fails, is left for the next call."""
    return compact(spark, uri, key) is not None


def compact(spark: SparkSession, uri: str, key: Sequence[str]) -> Compaction | None:
    """Rewrite what `select` chooses in one commit; None when there is nothing to rewrite,
    the table's layout is not one the driver rewrites, or the commit lost to another."""
    state = table_state(uri)
    if state is None:
        return None
    refusal = unhandled_layout(state)
    if refusal is not None:
        log.debug("no compaction of %s: %s", uri, refusal)
        return None
    selection = select(state)
    if selection.left:
        log.info("%s files of %s have most rows hidden by deletion vectors but exceed the driver's %s bytes: "
                 "left for OPTIMIZE or REORG (maintenance)", len(selection.left), uri, sizes().compact_bytes)
    if not selection.files:
        return None
    schema = _arrow_schema(state)
    if schema is None:
        log.debug("no compaction of %s: a column type the driver does not write", uri)
        return None
    ensure_held(uri)
    try:
        return _rewrite(spark, state, selection, schema, key)
    except Exception as error:
        if not is_commit_conflict(error):
            raise
        log.info("compaction of %s lost to a concurrent commit; left for the next round", uri)
        return None


def unhandled_layout(state: TableState) -> str | None:
    """Why the driver does not rewrite this table's files, or None when it does."""
    if not state.plain_layout:
        return "partitioned or with mapped column names"
    features = REWRITTEN_FEATURES & (state.reader_features | set(state.protocol.get("writerFeatures") or ()))
    if features:
        return f"table features {sorted(features)}"
    return None


def select(state: TableState) -> Selection:
    """The files to rewrite: the small ones once more than `compact_files` are live
    (smallest first), then larger ones by the share of their rows hidden (largest share
    first), while the bytes read stay within `compact_bytes`."""
    limits = sizes()
    small = sorted((live for live in state.files if live.size < limits.small_file_bytes), key=lambda f: f.size)
    if len(small) <= limits.compact_files:
        small = []
    hidden = sorted((live for live in state.files
                     if live.size >= limits.small_file_bytes and hidden_share(live) > limits.rewrite_deleted_share),
                    key=hidden_share, reverse=True)
    budget = limits.compact_bytes
    taken_small, taken_hidden, left = [], [], []
    for live in small:
        if live.size > budget:
            break
        taken_small.append(live)
        budget -= live.size
    for live in hidden:
        if live.size > limits.compact_bytes:
            left.append(live)
        elif live.size <= budget:  # else the next compaction's
            taken_hidden.append(live)
            budget -= live.size
    if len(taken_small) < 2 and not taken_hidden:  # one file rewritten as one file gains nothing
        taken_small = []
    return Selection(tuple(taken_small), tuple(taken_hidden), tuple(left))


def hidden_share(live: LiveFile) -> float:
    """The share of a file's rows its deletion vector hides (0 when its rows are unknown)."""
    vector = live.deletion_vector
    if not vector or not live.records:
        return 0.0
    return int(vector["cardinality"]) / live.records


def _rewrite(spark: SparkSession, state: TableState, selection: Selection, schema: pa.Schema,
             key: Sequence[str]) -> Compaction | None:
    """Read, sort, write and commit; None when the table moved past the state read."""
    transaction = DeltaTransaction(spark, state.uri, None, still_newest(state.uri))
    if transaction.creating or snapshot_version(transaction.snapshot) != state.version:
        return None
    rows = _live_rows(state.uri, selection.files, schema)
    if rows is None:
        log.debug("no compaction of %s: a file lacks a column that may not be NULL", state.uri)
        return None
    rows = rows.sort_by([(column, "ascending", "at_start") for column in _table_names(schema, key)])
    added = [write_file(state.uri, part, data_change=False, row_group_rows=sizes().mv_row_group_rows or None)
             for part in _parts(rows)]
    now = int(time.time() * 1000)
    transaction.read_whole_table()  # a concurrent commit of files fails this one
    actions = [transaction.action("remove", removal(live, now, data_change=False)) for live in selection.files]
    actions += [transaction.added(add) for add in added]
    confirm_held(state.uri)
    commit_fence.reached()
    transaction.commit(transaction.sequence(actions), transaction.compaction_operation(), transaction.string_map({}),
                       None, None)
    done = Compaction(version=state.version + 1, removed=len(selection.files), added=len(added), rows=rows.num_rows,
                      bytes_read=sum(live.size for live in selection.files),
                      left=tuple(live.path for live in selection.left))
    log.info("compacted %s: %s files (%s small, %s mostly hidden; %s bytes) into %s, %s rows, version %s",
             state.uri, done.removed, len(selection.small), len(selection.hidden), done.bytes_read, done.added,
             done.rows, done.version)
    return done


def _arrow_schema(state: TableState) -> pa.Schema | None:
    """The table's columns as the driver writes them, or None for a type it does not."""
    import json

    from pyspark.sql.types import StructType

    from airflow_backfill.engine.delta.arrow_types import arrow_schema_of

    try:
        schema = arrow_schema_of(StructType.fromJson(json.loads(state.metadata["schemaString"])))
    except (KeyError, TypeError, NotImplementedError, ValueError):
        return None
    return schema if writable(schema.empty_table()) else None


def _live_rows(table_uri: str, chosen: Sequence[LiveFile], schema: pa.Schema) -> pa.Table | None:
    """The rows of `chosen` their vectors leave live, in the table's columns and types; None
    when a file lacks a column that may not be NULL."""
    parts = []
    for live in chosen:
        with files.parquet_file(live.uri) as parquet:
            present = set(parquet.schema_arrow.names)
            read = parquet.read(columns=[name for name in schema.names if name in present])
        columns = []
        for field in schema:
            if field.name in present:
                columns.append(read.column(field.name).cast(field.type))
            elif field.nullable:  # a column added after the file was written
                columns.append(pa.chunked_array([pa.nulls(read.num_rows, field.type)]))
            else:
                return None
        rows = pa.Table.from_arrays(columns, schema=schema)
        deleted = deleted_rows(table_uri, live.deletion_vector)
        if len(deleted):
            keep = np.ones(rows.num_rows, dtype=bool)
            keep[deleted.astype(np.int64)] = False
            rows = rows.filter(pa.array(keep))
        parts.append(rows)
    return pa.concat_tables(parts)


def _table_names(schema: pa.Schema, key: Sequence[str]) -> list[str]:
    """`key` as the table spells its columns."""
    names = {name.lower(): name for name in schema.names}
    return [names[column.lower()] for column in key]


def _parts(rows: pa.Table) -> list[pa.Table]:
    """`rows` in consecutive files of at most `sizes.mv_file_rows` rows (none when empty)."""
    bound = sizes().mv_file_rows or max(rows.num_rows, 1)
    return [rows.slice(start, bound) for start in range(0, rows.num_rows, bound)]
