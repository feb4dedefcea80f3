"""A replace or delete by a condition, of a table whose checksum lists its files, without
Delta's rebuild of the table's state.

Why: Delta's replaces (`replaceWhere`, `replaceOn`) and DELETE find the rows that meet
their condition with its DELETE command, which asks the snapshot for its file count and,
to carry the touched files' statistics over, for its files with statistics: both rebuild
the version's whole state from the log (three Spark jobs and 0.4 - 0.5 s of a one-row
round at SF 1, which was about a third of it). The checksum's file list (`listed_files`) already holds every
live file with its statistics. This module runs the same steps as Delta's DELETE with
deletion vectors over that list: Delta's own scan for the matching rows
(`DMLWithDeletionVectorsHelper.findTouchedFiles`, which writes the new deletion
vectors), then per touched file Delta's `AddFile.removeRows` (the file again with its
new deletion vector and its statistics' bounds marked wide, and the file with its old
vector removed), or its removal when no row is left. The new rows, if any, are written by
the transaction. The log entry holds the actions Delta's own replace or delete would
write; the condition may hold an EXISTS subquery, as a DELETE's may.

Only tables with deletion vectors enabled, and files whose statistics count their
records and, when they carry a deletion vector already, have wide bounds, take this
path: there Delta's own conversion of the statistics (`updateStatsToWideBounds`) would
change nothing but the `tightBounds` flag. Anything else returns None, and the caller
leaves the replace to Delta.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from airflow_backfill.engine.delta.log import DELETION_VECTORS_PROPERTY
from airflow_backfill.engine.internals import DeltaTransaction, added_file, scala_items, table_properties

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def replace_listed(transaction: DeltaTransaction, frame: DataFrame | None, files: Any, condition: str,
                   alias: str) -> Any | None:
    """The actions of a replace of the rows meeting `condition` (SQL over the table, named
    `alias`) by `frame`'s rows (None: none), for the live `files` the transaction's read
    version lists; None when the table or a file does not fit this path (see above).
    The transaction then counts as having read the whole table, as an overwrite does."""
    if table_properties(transaction.snapshot).get(DELETION_VECTORS_PROPERTY) != "true":
        return None
    if not all(_fits(added) for added in scala_items(files)):
        return None
    transaction.read_whole_table()
    actions = []
    now = int(time.time() * 1000)
    for added, fully_replaced, vector in transaction.rows_meeting(files, condition, alias):
        if fully_replaced:
            actions.append(transaction.removed(added, now))
        else:
            actions += transaction.without_rows(added, vector)
    if frame is not None:
        actions += transaction.write_files(frame)
    return transaction.sequence(actions)


def _fits(added: Any) -> bool:
    """Whether Delta's conversion of this file's statistics to wide bounds would only mark
    them wide: they count the file's records, and a file that already has a deletion vector
    has wide bounds (its all-NULL counts were never made logical)."""
    _, has_vector, stats = added_file(added)
    if not stats:
        return False
    parsed = json.loads(stats)
    if "numRecords" not in parsed:
        return False
    return not has_vector or parsed.get("tightBounds") is False
