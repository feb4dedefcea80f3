"""Apply a range of upstream epochs to the MV in one commit (catch-up and forward).

The range is read from the log store. For a stateless query it is netted per upstream
key, mapped through the MV query by Spark, and merged into the MV by delta-rs together
with the new watermark. An aggregate folds it into its per-group state first
(`aggregate_apply`). Re-running an already committed range is a no-op: the watermark
tells.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_backfill.engine.aggregate_apply import (
    apply_aggregate_changes,
    commit_watermarks_only,
    recover_state_ahead,
)
from airflow_backfill.engine.changes import COMMIT_TIMESTAMP, mv_changes, net_changes
from airflow_backfill.engine.delta_log import load_table, read_watermark
from airflow_backfill.engine.faults import maybe_crash
from airflow_backfill.engine.log_store import check_schema_unchanged, read_change_feed
from airflow_backfill.engine.mv_commit import CommitInfo, conform_changes, merge_changes, nullable_key
from airflow_backfill.exceptions import TargetError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

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
    start = watermark = current_watermark(job)
    if plan.aggregate is not None:
        watermark = recover_state_ahead(spark, job, plan, watermark, phase=phase, parallelism=parallelism)
    if watermark >= end_version:
        log.info("MV already at watermark %s >= %s: nothing to apply", watermark, end_version)
        if watermark > start:
            return AppliedRange(start, watermark, 0, 0, time.monotonic() - started)
        return None
    check_schema_unchanged(job.source, watermark, end_version)
    feed = read_change_feed(job.source, watermark, end_version)
    spark.conf.set("spark.sql.shuffle.partitions", str(parallelism))
    if plan.aggregate is not None and not feed.num_rows:
        mv_rows_changed = commit_watermarks_only(job, end_version, phase=phase, parallelism=parallelism)
    elif plan.aggregate is not None:
        mv_rows_changed = apply_aggregate_changes(
            spark, job, plan, feed, end_version, phase=phase, parallelism=parallelism
        )
    else:
        changes = spark.createDataFrame(feed.drop_columns([COMMIT_TIMESTAMP]))
        mv_rows_changed = _apply_stateless(spark, job, plan, changes, end_version, phase, parallelism)
    applied = AppliedRange(start, end_version, feed.num_rows, mv_rows_changed, time.monotonic() - started)
    log.info(
        "%s: applied epochs %s..%s (%s change rows, %s MV keys) in %.2fs",
        phase, watermark + 1, end_version, applied.change_rows, applied.mv_rows_changed, applied.seconds,
    )
    return applied


def _apply_stateless(
    spark: SparkSession, job: BackfillJob, plan: QueryPlan, changes: DataFrame, end_version: int,
    phase: str, parallelism: int,
) -> int:
    """Net the changes per upstream key, map them through the query, merge them by MV key."""
    keyed = mv_changes(spark, net_changes(changes, plan.upstream_key), plan)
    target = load_table(job.target)
    arrow_changes = conform_changes(keyed.toArrow(), target)
    info = CommitInfo(phase=phase, epoch=end_version, parallelism=parallelism, rows=arrow_changes.num_rows)
    maybe_crash(phase, "after_write")
    merge_changes(job, arrow_changes, plan.mv_key, info, null_safe_keys=nullable_key(target, plan.mv_key),
                  table=target)
    maybe_crash(phase, "after_commit")
    return arrow_changes.num_rows
