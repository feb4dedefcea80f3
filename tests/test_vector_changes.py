"""A commit without change files feeds the rows Delta's change-feed reader derives from its
data files and their deletion vectors: a file added or removed alone its live rows, a file
removed and added again the rows its new vector marks beyond the old one; nothing for
files rewritten without a change of data or a MERGE that changed no row; and None (left
to Spark) where Delta's reader would bring rows back or the pairing is not one to one."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from airflow_backfill.engine.delta.deletion_vectors import write_vectors
from airflow_backfill.engine.delta.vector_changes import DELETE, INSERT, commit_file_changes


def test_a_commits_changed_rows_follow_its_adds_removes_and_vectors(tmp_path):
    uri = str(tmp_path)
    pq.write_table(pa.table({"k": range(10)}), tmp_path / "a.parquet")
    old, new, unrelated = write_vectors(uri, [np.array([1, 2], np.uint64), np.array([1, 2, 5, 7], np.uint64),
                                              np.array([3], np.uint64)])

    def action(kind: str, vector: dict | None = None, *, data_change: bool = True, path: str = "a.parquet") -> dict:
        entry = {"path": path, "size": 100, "dataChange": data_change, "stats": json.dumps({"numRecords": 10})}
        return {kind: {**entry, "deletionVector": vector} if vector else entry}

    def changes(*actions: dict) -> list[tuple[str, list[int] | None, bool, int]] | None:
        found = commit_file_changes(uri, list(actions))
        return None if found is None else [
            (c.change_type, None if c.selection is None else c.selection.positions.tolist(),
             c.selection is not None and c.selection.inverted, c.rows) for c in found]

    assert changes(action("add")) == [(INSERT, None, False, 10)]
    assert changes({"remove": {"path": "a.parquet", "dataChange": True}}) == [(DELETE, None, False, 10)]  # footer
    assert changes(action("add", old)) == [(INSERT, [1, 2], True, 8)]
    assert changes(action("remove", old)) == [(DELETE, [1, 2], True, 8)]
    assert changes(action("remove", old), action("add", new)) == [(DELETE, [5, 7], False, 2)]
    assert changes(action("remove"), action("add", old)) == [(DELETE, [1, 2], False, 2)]
    assert changes(action("remove", old), action("add", old)) == []
    assert changes(action("remove", old, data_change=False), action("add", new, data_change=False)) == []
    assert changes(action("remove", new), action("add", old)) is None  # rows brought back
    assert changes(action("remove", old), action("add", unrelated)) is None
    assert changes(action("remove"), action("add")) is None
    assert changes(action("add"), action("add", old)) is None  # the same path twice
    no_op = {"commitInfo": {"operation": "MERGE", "operationMetrics": {
        "numTargetRowsInserted": "0", "numTargetRowsUpdated": "0", "numTargetRowsDeleted": "0"}}}
    assert changes(no_op, action("remove"), action("add", old)) == []
