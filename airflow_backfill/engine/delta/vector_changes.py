"""The change rows of a commit that wrote no change files, file by file, as Delta's change
feed reader derives them from the data files it added and removed and their deletion
vectors.

Why: with deletion vectors on (the Databricks default), Spark's DELETE writes no change
file: it removes each file it touches and adds it again under the same path with a vector
that marks more rows, and Delta's reader (`CDCReader.getDeletedAndAddedRows`) derives the
feed from the two vectors. Which rows of which file changed is in the log and the vectors,
so the driver reads such a commit as it reads change files:

- a data file added alone: the rows its vector leaves live are inserts (a blind append's
  file has no vector: every row);
- a data file removed alone: the rows its vector left live are deletes;
- a file removed and added again under the same path: the rows the new vector marks beyond
  the old one are deletes.

Adds and removes that change no data (`dataChange: false`: OPTIMIZE, compaction) feed
nothing, nor does a MERGE whose metrics count no row inserted, updated or deleted (Delta's
reader skips its files). Left to Spark (None): a new vector that does not hold the old one
(rows brought back, as a RESTORE does, which Delta reads as inserts), a file removed and
added again with no vector on either side, a path added or removed twice in one commit.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import numpy as np

from airflow_backfill.engine.delta.deletion_vectors import deleted_rows
from airflow_backfill.engine.delta.row_positions import RowSelection
from airflow_backfill.storage import files
from airflow_backfill.storage.uri import join

log = logging.getLogger(__name__)

INSERT = "insert"
DELETE = "delete"
_MERGE_ROW_METRICS = ("numTargetRowsInserted", "numTargetRowsUpdated", "numTargetRowsDeleted")
"""The metrics by which Delta's reader tells a MERGE that changed no row."""


@dataclass(frozen=True)
class FileChange:
    """Rows of one data file that a commit inserted or deleted, all of one change type."""

    uri: str
    change_type: str
    selection: RowSelection | None
    """The file's rows that changed; None: every row."""
    rows: int
    """Rows that changed."""
    size: int
    """The file's bytes, as its log entry gives them."""


def commit_file_changes(table_uri: str, actions: list[dict[str, Any]]) -> list[FileChange] | None:
    """The changed rows of a commit without change files (its parsed `actions`), file by
    file; None for a shape left to Spark (see the module's text)."""
    if _changes_no_row(actions):
        return []
    added = [action["add"] for action in actions if "add" in action and action["add"].get("dataChange", True)]
    removed = [action["remove"] for action in actions
               if "remove" in action and action["remove"].get("dataChange", True)]
    twice = [path for entries in (added, removed)
             for path, count in Counter(entry["path"] for entry in entries).items() if count > 1]
    if twice:
        log.info("change rows left to Spark: %s is added or removed twice in one commit", twice[0])
        return None
    re_added = {entry["path"]: entry for entry in added}
    changes: list[FileChange] = []
    for entry in removed:
        after = re_added.pop(entry["path"], None)
        change = _whole_file(table_uri, entry, DELETE) if after is None else _new_marks(table_uri, entry, after)
        if change is None:
            return None
        if change.rows:
            changes.append(change)
    for entry in re_added.values():
        change = _whole_file(table_uri, entry, INSERT)
        if change.rows:
            changes.append(change)
    return changes


def _changes_no_row(actions: list[dict[str, Any]]) -> bool:
    """A MERGE whose metrics count no row inserted, updated or deleted: Delta's reader
    feeds nothing for it, whatever files it rewrote."""
    info: dict[str, Any] = next((action["commitInfo"] for action in actions if "commitInfo" in action), {})
    metrics = info.get("operationMetrics") or {}
    return info.get("operation") == "MERGE" and all(str(metrics.get(name)) == "0" for name in _MERGE_ROW_METRICS)


def _whole_file(table_uri: str, entry: dict[str, Any], change_type: str) -> FileChange:
    """A file added or removed alone: its rows that its vector leaves live."""
    uri = _data_file(table_uri, entry)
    vector = entry.get("deletionVector")
    records = _records(entry)
    if records is None:
        records = files.parquet_metadata(uri).num_rows
    selection = RowSelection.all_but(deleted_rows(table_uri, vector)) if vector else None
    rows = records if selection is None else selection.rows(records)
    return FileChange(uri, change_type, selection, rows, int(entry.get("size") or 0))


def _new_marks(table_uri: str, before: dict[str, Any], after: dict[str, Any]) -> FileChange | None:
    """A file removed and added again: the rows its new vector marks beyond the old one, as
    deletes; None when the new vector does not hold the old one, or neither side has one."""
    if not after.get("deletionVector"):
        log.info("change rows left to Spark: %s is added again without a deletion vector", after["path"])
        return None
    old = deleted_rows(table_uri, before.get("deletionVector"))
    new = deleted_rows(table_uri, after["deletionVector"])
    marks = np.setdiff1d(new, old, assume_unique=True)
    if len(new) - len(marks) != len(old):
        log.info("change rows left to Spark: the new deletion vector of %s does not hold the old one", after["path"])
        return None
    return FileChange(_data_file(table_uri, after), DELETE, RowSelection.at(marks), len(marks),
                      int(after.get("size") or 0))


def _data_file(table_uri: str, entry: dict[str, Any]) -> str:
    return join(table_uri, unquote(entry["path"]))


def _records(entry: dict[str, Any]) -> int | None:
    """A file's physical rows from its logged statistics (None when not logged)."""
    try:
        records = json.loads(entry.get("stats") or "{}").get("numRecords")
    except ValueError:
        return None
    return None if records is None else int(records)
