"""Apply a range of upstream epochs to the MV in one commit (catch-up and forward).

The range is read from the log store, netted per upstream key, mapped through the MV
query by Spark, and merged into the MV by delta-rs together with the new watermark.
Re-running an already committed range is a no-op: the watermark tells.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
from deltalake import DeltaTable

from airflow_backfill.engine.changes import COMMIT_TIMESTAMP, PRESENT, mv_changes, net_changes
from airflow_backfill.engine.delta_log import arrow_schema, read_watermark
from airflow_backfill.engine.faults import maybe_crash
from airflow_backfill.engine.log_store import check_schema_unchanged, read_change_feed
from airflow_backfill.engine.mv_commit import CommitInfo, merge_changes
from airflow_backfill.exceptions import TargetError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_backfill.engine.query import QueryPlan
    from airflow_backfill.job import BackfillJob

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AppliedRange:
    """One MV commit of the upstream epochs (start_watermark, end_version]."""

    start_watermark: int
    end_version: int
    change_rows: int
    mv_rows_changed: int
    seconds: float

    @property
    def epochs(self) -> int:
        return self.end_version - self.start_watermark


def current_watermark(job: BackfillJob) -> int:
    """The MV's watermark; an error when the MV was never snapshotted."""
    watermark = read_watermark(job.target, job.app_id)
    if watermark is None:
        raise TargetError(
            f"the MV {job.target} does not exist yet: run the snapshot phase first "
            "(spark_jobs/snapshot.py, or the DAG's snapshot task)."
        )
    return watermark


def apply_epochs(
    spark: SparkSession,
    job: BackfillJob,
    plan: QueryPlan,
    end_version: int,
    *,
    phase: str,
    parallelism: int,
) -> AppliedRange | None:
    """Bring the MV from its watermark to `end_version`; None when already there."""
    started = time.monotonic()
    watermark = current_watermark(job)
    if watermark >= end_version:
        log.info("MV already at watermark %s >= %s: nothing to apply", watermark, end_version)
        return None
    check_schema_unchanged(job.source, watermark, end_version)
    feed = read_change_feed(job.source, watermark, end_version)
    spark.conf.set("spark.sql.shuffle.partitions", str(parallelism))
    changes = spark.createDataFrame(feed.drop_columns([COMMIT_TIMESTAMP]))
    keyed = mv_changes(spark, net_changes(changes, plan.upstream_key), plan)
    arrow_changes = _conform(keyed.toArrow(), DeltaTable(job.target))
    info = CommitInfo(phase=phase, epoch=end_version, parallelism=parallelism, rows=arrow_changes.num_rows)
    maybe_crash(phase, "after_write")
    merge_changes(job, arrow_changes, plan.mv_key, info)
    maybe_crash(phase, "after_commit")
    applied = AppliedRange(watermark, end_version, feed.num_rows, arrow_changes.num_rows,
                           time.monotonic() - started)
    log.info(
        "%s: applied epochs %s..%s (%s change rows, %s MV keys) in %.2fs",
        phase, watermark + 1, end_version, applied.change_rows, applied.mv_rows_changed, applied.seconds,
    )
    return applied


def _conform(changes: pa.Table, mv: DeltaTable) -> pa.Table:
    """Cast Spark's Arrow output to the MV's exact types so the merge never widens them."""
    target = arrow_schema(mv)
    fields = [target.field(name) for name in target.names] + [pa.field(PRESENT, pa.bool_())]
    schema = pa.schema([f.with_nullable(True) for f in fields])
    return changes.select(schema.names).cast(schema)
