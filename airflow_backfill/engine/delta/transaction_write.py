"""A DataFrame write to a Delta table whose commit carries the watermark, without Delta's
rebuild of the table's state to look the watermark up, and with a hook between writing the
files and committing them (a table's commit may wait for another's).

The writer options `txnAppId` / `txnVersion` make Delta ask its snapshot for the table's
transaction versions (`OptimisticTransaction.txnVersion`), which Delta 4.4 answers only by
rebuilding the whole state of the table: three Spark jobs and 0.8 - 1 s per commit, more
than an append of a round's rows costs (docs/benchmarks.md). This module runs the same
write command (`WriteIntoDelta`: appends, overwrites, `replaceOn`, `replaceWhere`) in a
transaction it opens itself through py4j, reads the watermark with delta-rs instead, and adds the
`SetTransaction` action to the commit. The log entry is the one the writer options
produce: data, app transaction and `userMetadata` in one atomic commit.

Two guarantees of the writer options are kept:
- a write whose version is not above the recorded one is skipped (a retried round is a
  no-op): the watermark is read after the transaction has pinned its read version, and
  watermarks only grow, so a recorded version below `version` now was below it then;
- a concurrent commit of the same app transaction fails this one: the app id is
  registered among the transaction's reads, which Delta's conflict checker compares with
  every commit that won the race (`ConcurrentTransactionException`).

An overwrite of a table whose checksum lists its files (`listed_files`: under 2,000 files)
removes those files instead of asking Delta's rebuilt state for them, which would cost
the same three jobs again; `overwrite_with_rows` commits such an overwrite with one file
the driver wrote from rows it holds (`driver_file`, no Spark job); `replace_with_watermark`
marks the rows a replace or delete removes in deletion vectors from that list too
(`listed_replace`).

Relies on delta-spark 4.4's JVM classes (`constraints-3.11.txt` and `airflow_backfill/jvm/poms/spark.xml` pin it);
`tests/test_transaction_write.py` checks the log entries and both guarantees.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from deltalake.exceptions import TableNotFoundError

from airflow_backfill.engine.delta import commit_fence
from airflow_backfill.engine.delta.driver_file import writable, write_change_file, write_file
from airflow_backfill.engine.delta.listed_files import listed_files
from airflow_backfill.engine.delta.listed_replace import replace_listed
from airflow_backfill.engine.delta.log import (
    DELETION_VECTORS_PROPERTY,
    keeps_change_feed,
    load_table,
    still_newest,
)
from airflow_backfill.engine.delta.patch_actions import MarkedFile, vector_actions
from airflow_backfill.engine.internals import (
    DeltaTransaction,
    scala_items,
    snapshot_version,
    table_properties,
    table_schema_json,
)
from airflow_backfill.storage.lease import confirm_held

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

APPEND = "Append"
TARGET_ALIAS = "__mv"
"""The alias of the table in `replace_with_watermark`'s condition."""
OVERWRITE = "Overwrite"


def write_with_watermark(
    frame: DataFrame, uri: str, *, mode: str, options: Mapping[str, str], app_id: str, version: int,
    user_metadata: str, before_commit: Callable[[], None] | None = None,
    new_table_properties: Mapping[str, str] | None = None,
) -> bool:
    """Write `frame` into the Delta table at `uri` (`mode` APPEND or OVERWRITE, Delta writer
    `options` such as `replaceOn` or `replaceWhere`) in one commit that records app transaction
    (`app_id`, `version`) and `user_metadata`. False, with nothing written, when the
    table already records `version` or a later one. `before_commit` runs once the files
    are written, before the commit (it may wait for another table's commit, or raise to
    leave this one uncommitted). A table not created yet is created by the commit, with
    `new_table_properties` (the log entry Delta's writer makes of a first write with
    those properties as options)."""
    return bool(_commit(frame.sparkSession, uri, frame, mode=mode, options=options, app_id=app_id, version=version,
                        user_metadata=user_metadata, before_commit=before_commit,
                        new_table_properties=new_table_properties))


def commit_watermark(spark: SparkSession, uri: str, *, app_id: str, version: int, user_metadata: str) -> bool:
    """A commit of the app transaction alone (no data, no Spark job), as
    `write_with_watermark` would make of an empty append."""
    return bool(_commit(spark, uri, None, mode=APPEND, options={}, app_id=app_id, version=version,
                        user_metadata=user_metadata))


def replace_with_watermark(
    spark: SparkSession, uri: str, frame: DataFrame | None, *, condition: str, app_id: str, version: int,
    user_metadata: str,
) -> bool | None:
    """Replace the rows of the table at `uri` that meet `condition` (SQL over the table,
    aliased `TARGET_ALIAS`; it may hold an EXISTS subquery over a temporary view) by
    `frame`'s rows (None: delete them), in one commit with the watermark, from the file
    list of the table's checksum (`listed_replace`). False when the table already records
    `version` or a later one; None, with nothing written, when the checksum lists no
    files or they do not fit: the caller then replaces through Delta's own command."""
    return _commit(spark, uri, frame, mode=OVERWRITE, options={}, app_id=app_id, version=version,
                   user_metadata=user_metadata, replaced=condition)


def overwrite_with_rows(
    spark: SparkSession, uri: str, rows: pa.Table, *, app_id: str, version: int, user_metadata: str,
    before_commit: Callable[[], None] | None = None, changes: pa.Table | None = None,
) -> bool | None:
    """Overwrite the table at `uri` with `rows` (the driver's, in the table's columns),
    written by the driver as one file (`driver_file`), in one commit with the watermark.
    `changes`: the overwrite's change rows (`overwrite_feed`), written as its change file
    when the table keeps a change feed. False when the table already records `version` or
    a later one; None, with nothing written and `before_commit` not run, when the
    checksum lists no files or the rows do not fit the table's schema: the caller then
    writes them through Spark."""
    return _commit(spark, uri, None, mode=OVERWRITE, options={}, app_id=app_id, version=version,
                   user_metadata=user_metadata, before_commit=before_commit, rows=rows, changes=changes)


def patch_with_watermark(
    spark: SparkSession, uri: str, *, read_version: int, marked: Sequence[MarkedFile], rows: pa.Table | None,
    changes: pa.Table | None, app_id: str, version: int, user_metadata: str, predicate: str,
    before_commit: Callable[[], None] | None = None,
) -> bool | None:
    """Delete the `marked` rows of the table at `uri` (deletion vectors), append `rows` (the
    driver's, in the table's columns) and record `changes` as the commit's change file, in
    one commit with the watermark (`patch_actions`). `read_version`: the version the marked
    rows were found at. False when the table already records `version` or a later one;
    None, with nothing committed, when the table moved past `read_version`, keeps no
    deletion vectors, or the rows do not fit its schema: the caller then writes another way."""
    transaction = DeltaTransaction(spark, uri, app_id, still_newest(uri))
    if transaction.creating:
        return None
    recorded = load_table(uri).transaction_version(app_id)
    if recorded is not None and recorded >= version:
        return False
    snapshot = transaction.snapshot
    properties = table_properties(snapshot)
    if snapshot_version(snapshot) != read_version or properties.get(DELETION_VECTORS_PROPERTY) != "true":
        return None
    if rows is not None and rows.num_rows and not _rows_fit(rows, snapshot, properties):
        return None
    operation = transaction.write_operation(OVERWRITE, predicate, user_metadata, None)
    with transaction.active():
        transaction.read_whole_table()  # a concurrent commit of files fails this one
        actions = [transaction.action(kind, fields) for kind, fields in vector_actions(uri, marked)]
        if rows is not None and rows.num_rows:
            actions.append(transaction.added(write_file(uri, rows)))
        if changes is not None and changes.num_rows and keeps_change_feed(properties):
            actions.append(transaction.change_file(write_change_file(uri, changes)))
        if before_commit is not None:
            before_commit()
        confirm_held(uri)
        commit_fence.reached()
        transaction.commit(transaction.sequence(actions), operation, transaction.string_map({}), app_id, version)
    return True


def _commit(spark: SparkSession, uri: str, frame: DataFrame | None, *, mode: str, options: Mapping[str, str],
            app_id: str, version: int, user_metadata: str, replaced: str | None = None,
            before_commit: Callable[[], None] | None = None, rows: pa.Table | None = None,
            changes: pa.Table | None = None, new_table_properties: Mapping[str, str] | None = None) -> bool | None:
    # A concurrent commit of the same app id now conflicts.
    transaction = DeltaTransaction(spark, uri, app_id, still_newest(uri))
    if transaction.creating and new_table_properties is None:
        raise TableNotFoundError(f"no Delta table at {uri} to write to")
    recorded = None if transaction.creating else load_table(uri).transaction_version(app_id)
    if recorded is not None and recorded >= version:
        return False
    operation = transaction.write_operation(mode, options.get("replaceWhere", replaced), user_metadata,
                                            options.get("replaceOn"))
    with transaction.active():  # what Delta's own commands do: the write's scans register their reads
        snapshot = transaction.snapshot
        files = listed_files(snapshot) if mode == OVERWRITE and not options else None
        fits = files is not None and (frame is None or _same_columns(frame, snapshot))
        no_tags = transaction.string_map({})
        if rows is not None:
            if files is None:
                return None
            properties = table_properties(snapshot)
            if not _rows_fit(rows, snapshot, properties):
                return None
            transaction.read_whole_table()
            written = [transaction.added(write_file(uri, rows))]
            if changes is not None and keeps_change_feed(properties):
                written.append(transaction.change_file(write_change_file(uri, changes)))
            actions, tags = _replacing(transaction, files, written), no_tags
        elif replaced is not None:
            actions = replace_listed(transaction, frame, files, replaced, TARGET_ALIAS) if fits else None
            if actions is None:
                return None
            tags = no_tags
        elif frame is None:
            actions, tags = transaction.sequence([]), no_tags
        elif fits:
            actions, tags = _overwrite_listed(transaction, frame, files), no_tags
        else:
            actions, tags = transaction.write_into_delta(mode, options, new_table_properties or {}, frame)
        if before_commit is not None:
            before_commit()
        confirm_held(uri)  # on S3: this run still holds the MV's writer lease, asked of the store
        commit_fence.reached()
        transaction.commit(actions, operation, tags, app_id, version)
    return True


def _overwrite_listed(transaction: DeltaTransaction, frame: DataFrame, files: Any) -> Any:
    """The actions of an overwrite by `frame`'s rows of the listed `files`."""
    transaction.read_whole_table()
    return _replacing(transaction, files, transaction.write_files(frame))


def _replacing(transaction: DeltaTransaction, files: Any, added: Iterable[Any]) -> Any:
    """The actions of an overwrite: add `added` and remove every file the read version's
    checksum lists (as Delta's overwrite removes the files its rebuilt state lists). The
    caller has counted the whole table as read, so a concurrent commit that adds or removes
    files fails this one, as it fails Delta's own overwrite."""
    now = int(time.time() * 1000)
    return transaction.sequence([*added, *(transaction.removed(live, now) for live in scala_items(files))])


def _rows_fit(rows: pa.Table, snapshot: Any, properties: Mapping[str, str]) -> bool:
    """Whether `rows` have the table's columns in order, of the Arrow types Spark's schema
    maps to, with no NULL in a non-nullable column, and only types `driver_file` describes,
    in a table (of `properties`) without CHECK constraints, generated or identity columns
    or column mapping (Spark's writer checks, casts and maps anything else)."""
    from pyspark.sql.types import StructType

    from airflow_backfill.engine.delta.arrow_types import arrow_schema_of

    if any(key.startswith("delta.constraints.") for key in properties) or properties.get(
            "delta.columnMapping.mode", "none") != "none":
        return False
    schema_json = table_schema_json(snapshot)
    if "delta.generationExpression" in schema_json or "delta.identity" in schema_json:
        return False
    table = StructType.fromJson(json.loads(schema_json))
    try:
        expected = arrow_schema_of(table)
    except (TypeError, NotImplementedError):
        return False
    if rows.schema.names != expected.names or rows.schema.types != expected.types or not writable(rows):
        return False
    return all(field.nullable or not rows.column(field.name).null_count for field in table.fields)


def _same_columns(frame: DataFrame, snapshot: Any) -> bool:
    """Whether `frame` has the table's columns, names and types, in order: Delta's own
    writer checks and casts the rest, a direct `writeFiles` would write them as they are."""
    from pyspark.sql.types import StructType

    table = StructType.fromJson(json.loads(table_schema_json(snapshot)))
    return [(f.name, f.dataType) for f in frame.schema.fields] == [(f.name, f.dataType) for f in table.fields]
