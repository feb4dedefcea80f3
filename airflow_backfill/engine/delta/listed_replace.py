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

from airflow_backfill.engine.delta.listed_files import scala_items
from airflow_backfill.engine.delta.log import DELETION_VECTORS_PROPERTY

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

def replace_listed(jvm: Any, jspark: Any, delta_log: Any, transaction: Any, frame: DataFrame | None, files: Any,
                   condition: str, alias: str) -> Any | None:
    """The actions of a replace of the rows meeting `condition` (SQL over the table, named
    `alias`) by `frame`'s rows (None: none), for the live `files` the transaction's read
    version lists; None when the table or a file does not fit this path (see above).
    The transaction then counts as having read the whole table, as an overwrite does."""
    snapshot = transaction.snapshot()
    if snapshot.metadata().configuration().get(DELETION_VECTORS_PROPERTY).getOrElse(None) != "true":
        return None
    if not all(_fits(added) for added in scala_items(files)):
        return None
    delta = jvm.org.apache.spark.sql.delta
    transaction.readWholeTable()
    none = jvm.scala.Option.apply(None)
    index = delta.files.TahoeBatchFileIndex(jspark, "delete", files, delta_log, delta_log.dataPath(), snapshot, False)
    table = delta_log.createDataFrame(snapshot, files, False, none)
    matching = table.alias(alias).filter(condition).queryExecution().analyzed()  # Filter(condition, table)
    helper = getattr(getattr(delta.commands, "DMLWithDeletionVectorsHelper$"), "MODULE$")
    scan = helper.createTargetDfForScanningForMatches(jspark, matching.child(), index)
    touched = helper.findTouchedFiles(jspark, transaction, True, delta_log, scan, index, matching.condition(), "DELETE")
    actions = jvm.java.util.ArrayList()
    now = int(time.time() * 1000)
    for file in scala_items(touched):
        if file.isFullyReplaced():
            actions.add(file.fileLogEntry().removeWithTimestamp(now, True))
        else:
            kept, removed = _pair(file.fileLogEntry().removeRows(file.newDeletionVector(), True, True))
            actions.add(kept)
            actions.add(removed)
    if frame is not None:
        for added in scala_items(transaction.writeFiles(frame._jdf)):
            actions.add(added)
    return jvm.org.apache.spark.api.python.PythonUtils.toSeq(actions)


def _fits(added: Any) -> bool:
    """Whether Delta's conversion of this file's statistics to wide bounds would only mark
    them wide: they count the file's records, and a file that already has a deletion vector
    has wide bounds (its all-NULL counts were never made logical)."""
    stats = added.stats()
    if not stats:
        return False
    parsed = json.loads(stats)
    if "numRecords" not in parsed:
        return False
    return added.deletionVector() is None or parsed.get("tightBounds") is False


def _pair(scala_tuple: Any) -> tuple[Any, Any]:
    return scala_tuple._1(), scala_tuple._2()
