"""Keep an MV's files healthy: compaction, key clustering, deletion-vector purge, vacuum.

Every MERGE adds small files and marks replaced rows in deletion vectors, so over time a
round reads more files and more vectors. `OPTIMIZE ... ZORDER BY (key)` rewrites the MV
into fewer files clustered by its key (so later MERGEs touch fewer of them); `REORG
TABLE ... APPLY (PURGE)` rewrites files whose vectors mark many rows; VACUUM deletes
unreferenced files older than the table's retention (never less: Delta refuses a
shorter retention, which keeps time travel to epochs a downstream job may still read).
None of these commits changes data (`dataChange = false`): the watermark, the MV's rows
and its change feed stay as they are. Runs under the MV's writer lock, between phases; on
S3 each command first asks the store whether this run still holds the MV's writer lease
(Delta's commands write and commit in one call, so that is the last point before each
commit, as for the rounds' MERGE).

OPTIMIZE writes files of up to 1 GiB by default, so an MV smaller than that becomes one
file and a round's key bounds (`delta.key_range`) have nothing left to skip; a smaller
`max_file_size` keeps it in several files of separate key ranges.
"""

from __future__ import annotations

import logging
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_backfill.engine.aggregates.state import state_uri
from airflow_backfill.engine.delta.log import table_exists
from airflow_backfill.engine.joins.rounds import join_plan
from airflow_backfill.engine.planning.query import plan_query
from airflow_backfill.engine.session_settings import session_settings
from airflow_backfill.engine.writer_lock import writer_lock
from airflow_backfill.job import validate_optional_cap
from airflow_backfill.storage.lease import confirm_held

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_backfill.job import BackfillJob

log = logging.getLogger(__name__)

PHASE_MAINTENANCE = "maintenance"
MAX_FILE_SIZE_SETTING = "spark.databricks.delta.optimize.maxFileSize"


@dataclass(frozen=True)
class MaintenanceResult:
    tables: tuple[str, ...]
    """The Delta tables maintained: the MV, and an aggregate's state table."""
    files_before: int
    files_after: int
    seconds: float


def maintain_mv(
    spark: SparkSession, job: BackfillJob, *, cluster: bool = True, purge: bool = True, vacuum: bool = False,
    max_file_size: int | None = None,
) -> MaintenanceResult:
    """Compact (and cluster by key), purge deletion vectors and optionally vacuum the MV;
    `max_file_size`: the largest file OPTIMIZE writes, in bytes (None: Delta's 1 GiB)."""
    validate_optional_cap("max_file_size", max_file_size)
    from delta.tables import DeltaTable

    started = time.monotonic()
    plan = join_plan(job).flat if job.is_join else plan_query(job.query, job.primary_key)
    tables = [job.target] + ([state_uri(job.target)] if plan.aggregate is not None else [])
    with writer_lock(job.target, job.name, PHASE_MAINTENANCE), _largest_file(spark, max_file_size):
        before = after = 0
        for uri in tables:
            if not table_exists(uri):
                continue
            before += _file_count(spark, uri)
            table = DeltaTable.forPath(spark, uri)
            keys = list(plan.mv_key) if uri == job.target else [c for c in table.toDF().columns if c.startswith("__g")]
            confirm_held(uri)
            if cluster:
                table.optimize().executeZOrderBy(*keys)
            else:
                table.optimize().executeCompaction()
            if purge:
                confirm_held(uri)
                spark.sql(f"REORG TABLE delta.`{uri}` APPLY (PURGE)")
            if vacuum:
                confirm_held(uri)
                table.vacuum()  # the table's own retention (delta.deletedFileRetentionDuration)
            after += _file_count(spark, uri)
            log.info("maintained %s", uri)
    seconds = time.monotonic() - started
    log.info("maintenance of %s: %s files -> %s in %.1fs", job.target, before, after, seconds)
    return MaintenanceResult(tuple(tables), before, after, seconds)


def _file_count(spark: SparkSession, uri: str) -> int:
    return int(spark.sql(f"DESCRIBE DETAIL delta.`{uri}`").collect()[0]["numFiles"])


def _largest_file(spark: SparkSession, max_file_size: int | None) -> AbstractContextManager[None]:
    """OPTIMIZE's file size for the block only, so no later write of the session inherits it."""
    return session_settings(spark, {} if max_file_size is None else {MAX_FILE_SIZE_SETTING: str(max_file_size)})
