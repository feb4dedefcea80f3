"""The log actions of a patch: some rows of a table marked deleted in deletion vectors, new
rows appended in a file of their own, and the change file saying what changed, all
written by the driver.

Why: a round that changes a few keys of a large table needs to touch only their rows.
Delta's DELETE and MERGE find those rows with Spark jobs and write the vectors, a second
or more per round; the driver knows where the rows are (`keyed_rows`), so it writes one
vector file for every touched data file (`deletion_vectors`), one Parquet file of the new
rows and one change file, in milliseconds. The change file makes every change-feed reader
(Spark, delta-rs and the engine's own) read the commit's changes from it alone: two rows
per changed row, whatever the size of the files the rows sat in.

Each touched file is removed under its old vector and added again with the union of its
old and new deleted rows, its statistics marked as bounds that may be wide (the protocol's
`tightBounds: false`, as Delta's own `AddFile.removeRows` leaves them); a file left without
a live row is removed whole.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from airflow_backfill.engine.delta.deletion_vectors import deleted_rows, write_vectors

if TYPE_CHECKING:
    from airflow_backfill.engine.delta.log_state import LiveFile

_KEPT_FIELDS = ("path", "partitionValues", "size", "tags", "baseRowId", "defaultRowCommitVersion")
"""Fields of an add action its removal repeats (the protocol's extended file metadata)."""


@dataclass(frozen=True)
class MarkedFile:
    """A live file and the positions of its rows a patch deletes."""

    live: LiveFile
    positions: np.ndarray


def fits(live: LiveFile) -> bool:
    """Whether a file's statistics can be carried over as Delta carries them when it adds a
    vector: they count the file's records and, for a file that has a vector already, are
    marked wide."""
    stats = live.stats
    if "numRecords" not in stats:
        return False
    return live.deletion_vector is None or stats.get("tightBounds") is False


def marked_files(files: Sequence[LiveFile], file_of_row: np.ndarray, positions: np.ndarray) -> list[MarkedFile]:
    """The rows to delete grouped by file (`file_of_row` indexes `files`)."""
    marked = []
    for index, live in enumerate(files):
        mine = positions[file_of_row == index]
        if len(mine):
            marked.append(MarkedFile(live, np.unique(mine.astype(np.uint64))))
    return marked


def vector_actions(table_uri: str, marked: Sequence[MarkedFile]) -> list[tuple[str, dict[str, Any]]]:
    """The (kind, action) pairs that delete the marked rows: per file its removal under its
    old vector and, unless no row is left, its addition with the new one. The vectors are
    written to one new file of the table first."""
    now = int(time.time() * 1000)
    unions, kept = [], []
    for mark in marked:
        union = np.union1d(deleted_rows(table_uri, mark.live.deletion_vector), mark.positions)
        unions.append(union)
        kept.append(mark.live.records is None or len(union) < mark.live.records)
    descriptors = iter(write_vectors(table_uri, [union for union, keep in zip(unions, kept, strict=True) if keep]))
    actions: list[tuple[str, dict[str, Any]]] = []
    for mark, keep in zip(marked, kept, strict=True):
        actions.append(("remove", removal(mark.live, now)))
        if keep:
            actions.append(("add", with_vector(mark.live, next(descriptors))))
    return actions


def removal(live: LiveFile, timestamp_ms: int, *, data_change: bool = True) -> dict[str, Any]:
    """The remove action of a live file as it is (its vector and statistics included);
    `data_change` false for a rewrite that changes no row (change-feed readers skip it)."""
    removed = {name: live.add[name] for name in _KEPT_FIELDS if name in live.add}
    removed.update(deletionTimestamp=timestamp_ms, dataChange=data_change, extendedFileMetadata=True)
    if live.deletion_vector is not None:
        removed["deletionVector"] = live.deletion_vector
    if live.records is not None:
        removed["stats"] = json.dumps({"numRecords": live.records})
    return removed


def with_vector(live: LiveFile, descriptor: dict[str, Any]) -> dict[str, Any]:
    """The file added again with a new vector, its statistics marked as wide bounds (the
    statistics' text kept as it was otherwise, so that no bound changes by a re-encoding)."""
    added = {name: value for name, value in live.add.items() if name != "deletionVector"}
    added.update(dataChange=True, deletionVector=descriptor, stats=wide_bounds(str(live.add["stats"])))
    return added


def wide_bounds(stats: str) -> str:
    """A file's statistics JSON with `tightBounds` false."""
    for tight in ('"tightBounds":true', '"tightBounds": true'):
        if tight in stats:
            return stats.replace(tight, '"tightBounds":false')
    if '"tightBounds"' in stats:
        return stats
    body = stats.rstrip()
    return body[:-1] + (',"tightBounds":false}' if body[:-1].strip() not in ("{", "") else '"tightBounds":false}')
