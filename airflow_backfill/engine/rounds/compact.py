"""After a round: the tables it wrote compacted by the driver when rounds left many small files.

Why after the round: patches and the driver's appends add one small file a round, and
every reader pays per file (Spark's scans, the driver's lookups by key, the log). The
round's own commit is visible before this runs, so the MV's freshness never waits on it;
it runs under the writer lock the round holds, and `delta/compaction.py` decides whether
anything is worth rewriting (a cheap look at the log, cached per process, when not).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from airflow_backfill.engine.delta.compaction import compact_if_needed

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def compact_written(spark: SparkSession, tables: Sequence[tuple[str, Sequence[str]]]) -> None:
    """Compact each (table, its key columns) a round wrote, when its files call for it."""
    for uri, key in tables:
        compact_if_needed(spark, uri, key)
