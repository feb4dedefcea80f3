"""Read the upstream's log store, its Change Data Feed, for a range of epochs, with Spark.

Before reading, the range is checked from the Delta log alone (no data is read): every
version in it must still have its log entry and every file its change feed is made of
(change files, or the added and removed data files of commits without them and their
deletion vectors), and the schema must not have changed since the MV's watermark. A gap
would make the MV silently skip changes, so it is an error that says how to recover. The
rows themselves are read by delta-spark on the executors (`readChangeFeed`), only the
columns the query needs.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import pyarrow as pa

from airflow_backfill.engine.delta.deletion_vectors import vector_path
from airflow_backfill.engine.delta.log import arrow_schema, commit_actions, open_upstream
from airflow_backfill.exceptions import UpstreamError
from airflow_backfill.storage import files
from airflow_backfill.storage.uri import join, relative

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

CHANGE_TYPE = "_change_type"
COMMIT_VERSION = "_commit_version"
COMMIT_TIMESTAMP = "_commit_timestamp"
FEED_COLUMNS = frozenset({CHANGE_TYPE, COMMIT_VERSION, COMMIT_TIMESTAMP})
"""The columns a change feed adds to the upstream's."""
ARRIVING = ("insert", "update_postimage")
"""Change types that bring their row in."""
LEAVING = ("delete", "update_preimage")
"""Change types that take their row out."""

log = logging.getLogger(__name__)


def check_schema_unchanged(source: str, watermark: int, end_version: int) -> None:
    """Refuse a range across which the upstream's schema changed (the MV would be wrong).

    The range's log entries are checked first: without them the old schema cannot be
    read, and the missing history is the error to report. Only a range with a metaData
    action can change the schema, so the two versions are loaded only then.
    """
    _check_versions_available(source, watermark, end_version)
    if not any("metaData" in action for version in range(watermark + 1, end_version + 1)
               for action in commit_actions(source, version)):
        return
    before = arrow_schema(open_upstream(source, watermark))
    after = arrow_schema(open_upstream(source, end_version))
    if before != after:
        raise UpstreamError(
            f"the upstream's schema changed between version {watermark} (the MV's watermark) "
            f"and {end_version}: {_schema_diff(before, after)}. The MV was left untouched; "
            "rebuild it with a new snapshot (delete the target and rerun the DAG)."
        )


def read_change_feed(
    spark: SparkSession, source: str, watermark: int, end_version: int, columns: Sequence[str] | None = None,
) -> DataFrame:
    """The change rows of versions (watermark, end_version]: the upstream's `columns` (all
    when None) plus `_change_type` and `_commit_version`, read lazily by Spark."""
    check_range_readable(source, watermark, end_version)
    feed = (
        spark.read.format("delta").option("readChangeFeed", "true")
        .option("startingVersion", watermark + 1).option("endingVersion", end_version).load(source)
    )
    wanted = [c for c in feed.columns if c not in FEED_COLUMNS] if columns is None else list(columns)
    return feed.select(*(f"`{c}`" for c in wanted), CHANGE_TYPE, COMMIT_VERSION)


def read_upstream_as_of(spark: SparkSession, uri: str, version: int) -> DataFrame:
    """The upstream's rows as of `version` (Delta time travel; lazy, pruned by Spark): what a
    recompute, or a lookup of some keys' rows, reads instead of the feed."""
    return spark.read.format("delta").option("versionAsOf", version).load(uri)


def check_range_readable(source: str, watermark: int, end_version: int) -> None:
    """Every log entry of versions (watermark, end_version] and every file their feed is
    read from (`change_files`) still exists."""
    _check_versions_available(source, watermark, end_version)
    _check_change_files_available(source, watermark, end_version)


def _check_versions_available(source: str, watermark: int, end_version: int) -> None:
    log_dir = join(source, "_delta_log")
    present = set(files.list_names(log_dir))
    missing = [
        version
        for version in range(watermark + 1, end_version + 1)
        if f"{version:020d}.json" not in present
    ]
    if missing:
        raise UpstreamError(
            f"the upstream's log no longer has version(s) {missing[0]}..{missing[-1]} needed to "
            f"catch up from watermark {watermark}: its log expired (delta.logRetentionDuration) "
            "or was cleaned up. Changes cannot be replayed; rebuild the MV with a new snapshot."
        )


def change_files(source: str, version: int) -> list[str]:
    """The files the change feed of one upstream version is read from.

    A commit with `cdc` actions is read from its change files only; a commit without
    them (an append, a whole-file delete, a DELETE with deletion vectors) from its added
    and data-changing removed files and the deletion vectors stored beside them.
    """
    cdc: list[str] = []
    data: list[str] = []
    vectors: list[str] = []
    for action in commit_actions(source, version):
        if "cdc" in action:
            cdc.append(join(source, unquote(action["cdc"]["path"])))
        for kind in ("add", "remove"):
            if kind in action and action[kind].get("dataChange", True):
                data.append(join(source, unquote(action[kind]["path"])))
                vector = action[kind].get("deletionVector")
                if vector and vector.get("storageType") != "i":
                    vectors.append(vector_path(source, vector))
    return cdc or data + sorted(set(vectors))


def change_bytes(source: str, version: int) -> int:
    """Bytes of the files the change feed of one upstream version is read from (log sizes)."""
    actions = commit_actions(source, version)
    cdc = [action["cdc"].get("size", 0) for action in actions if "cdc" in action]
    if cdc:
        return int(sum(cdc))
    return int(sum(
        action[kind].get("size") or 0 for action in actions for kind in ("add", "remove")
        if kind in action and action[kind].get("dataChange", True)
    ))


def logged_change_rows(source: str, version: int) -> int | None:
    """Rows of one version's change feed counted from its log entry, for a commit that wrote
    no change files (its feed is made of its added and removed data files): a file added
    anew feeds its rows, a file removed whole its rows, and a file removed and added again
    with a new deletion vector only the rows the new vector marks beyond the old one.
    None when the commit wrote change files or some file's row count is not logged (then
    only its bytes tell). Bytes would count each file a deletion vector touched twice and
    whole, as if a replace of a few rows had rewritten its files."""
    actions = commit_actions(source, version)
    if any("cdc" in action for action in actions):
        return None
    removed = {action["remove"]["path"]: action["remove"] for action in actions
               if "remove" in action and action["remove"].get("dataChange", True)}
    rows = 0
    for action in actions:
        added = action.get("add")
        if added is None or not added.get("dataChange", True):
            continue
        before = removed.pop(added["path"], None)
        if before is not None:  # the same file, its deletion vector changed
            rows += _marked(added) - _marked(before)
            continue
        records = _records(added)
        if records is None:
            return None
        rows += records - _marked(added)
    for entry in removed.values():
        records = _records(entry)
        if records is None:
            return None
        rows += records - _marked(entry)
    return max(rows, 0)


def change_file_rows(source: str, version: int) -> tuple[int, int] | None:
    """(rows, files) of one version's change files, the rows from their Parquet footers (no
    row read); None when the version wrote none, or some are gone (the feed's reader then
    says the upstream was vacuumed)."""
    paths = [action["cdc"]["path"] for action in commit_actions(source, version) if "cdc" in action]
    if not paths:
        return None
    try:
        return sum(files.parquet_metadata(join(source, unquote(path))).num_rows for path in paths), len(paths)
    except FileNotFoundError:
        return None


def _marked(entry: dict[str, Any]) -> int:
    """Rows of a file that its deletion vector marks as deleted."""
    return int((entry.get("deletionVector") or {}).get("cardinality") or 0)


def _records(entry: dict[str, Any]) -> int | None:
    """A file's rows from its logged statistics (None when not logged)."""
    stats = entry.get("stats")
    if not stats:
        return None
    try:
        records = json.loads(stats).get("numRecords")
    except ValueError:
        return None
    return None if records is None else int(records)


_ROW_REWRITING_OPERATIONS = frozenset({"UPDATE", "DELETE", "OPTIMIZE"})
"""Operations that rewrite or remove rows and never add one (an UPDATE may still move a
row to another key, which only its change rows tell)."""


def range_inserts_rows(source: str, watermark: int, end_version: int) -> bool:
    """True unless every commit of (watermark, end_version] is known from its log entry
    to insert no row: an UPDATE, a DELETE, an OPTIMIZE, a MERGE whose metrics count no
    inserted row (delta-spark's and delta-rs' names), or a commit adding no data file.
    Read from the log alone; an operation this does not know counts as inserting."""
    for version in range(watermark + 1, end_version + 1):
        actions = commit_actions(source, version)
        info: dict[str, Any] = next((action["commitInfo"] for action in actions if "commitInfo" in action), {})
        operation = str(info.get("operation", "")).upper()
        metrics = info.get("operationMetrics") or {}
        inserted = metrics.get("numTargetRowsInserted", metrics.get("num_target_rows_inserted"))
        adds_data = any("add" in action and action["add"].get("dataChange", True) for action in actions)
        if not adds_data or operation in _ROW_REWRITING_OPERATIONS:
            continue
        if operation == "MERGE" and inserted is not None and int(inserted) == 0:
            continue
        return True
    return False


def round_end(source: str, watermark: int, latest: int, *, max_epochs: int | None, max_bytes: int | None,
              alignment: int | None = None) -> int:
    """The last epoch one round applies: every pending one, or fewer under the round's
    bounds (at least one epoch, so every round makes progress); with `alignment`, the last
    multiple of it in the range, when the range holds one."""
    end = aligned_end(watermark, latest if max_epochs is None else min(latest, watermark + max_epochs), alignment)
    if max_bytes is None:
        return end
    total = 0
    for version in range(watermark + 1, end + 1):
        total += change_bytes(source, version)
        if total > max_bytes and version > watermark + 1:
            return version - 1
    return end


def aligned_end(watermark: int, end: int, alignment: int | None) -> int:
    """`end`, or the last multiple of `alignment` in (watermark, end] when there is one."""
    if alignment is None or end // alignment * alignment <= watermark:
        return end
    return end // alignment * alignment


def last_multiple(watermark: int, latest: int, alignment: int) -> int:
    """The last multiple of `alignment` in (watermark, latest], else `watermark` (nothing to
    apply until the upstream reaches the next one)."""
    return max(watermark, latest // alignment * alignment)


def _check_change_files_available(source: str, watermark: int, end_version: int) -> None:
    for version in range(watermark + 1, end_version + 1):
        missing = [path for path in change_files(source, version) if not files.exists(path)]
        if missing:
            raise UpstreamError(
                f"the upstream's change files for version {version} are gone ({len(missing)} missing, "
                f"e.g. {relative(missing[0], source)}): the upstream was vacuumed past the MV's "
                f"watermark {watermark}. Changes cannot be replayed; rebuild the MV with a new snapshot "
                "(delete the target and rerun the DAG), and keep delta.deletedFileRetentionDuration "
                "longer than the backfill."
            )


def _schema_diff(before: pa.Schema, after: pa.Schema) -> str:
    old = {field.name: field for field in before}
    new = {field.name: field for field in after}
    parts = [f"added {name}" for name in new if name not in old]
    parts += [f"dropped {name}" for name in old if name not in new]
    parts += [
        f"{name}: {old[name].type} -> {new[name].type}"
        for name in old
        if name in new and old[name] != new[name]
    ]
    return ", ".join(parts) or "field order or metadata changed"
