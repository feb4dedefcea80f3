"""Phase 1, snapshot: the MV query over the upstream as of one pinned epoch.

Spark reads the upstream's Parquet files as listed by the Delta log at epoch `E`
(never the live directory, which keeps changing), writes the MV's files, and delta-rs
creates the MV in one commit whose watermark is `E`. The upstream is only read, so
it keeps committing meanwhile.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_backfill.engine import job_state
from airflow_backfill.engine.changes import apply_query
from airflow_backfill.engine.delta_log import (
    UpstreamInfo,
    check_upstream,
    open_upstream,
    read_watermark,
)
from airflow_backfill.engine.mv_commit import CommitInfo, add_actions_for, create_mv
from airflow_backfill.engine.query import plan_query

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from airflow_backfill.job import BackfillJob

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SnapshotResult:
    epoch: int
    rows: int
    skipped: bool
    seconds: float


def read_upstream_snapshot(spark: SparkSession, upstream: UpstreamInfo) -> DataFrame:
    """The upstream's rows as of `upstream.version`, read by Spark from the listed files."""
    from pyspark.sql.pandas.types import from_arrow_schema

    schema = from_arrow_schema(upstream.schema)
    files = open_upstream(upstream.uri, upstream.version).file_uris()
    log.info("upstream %s version %s: %s files", upstream.uri, upstream.version, len(files))
    if not files:
        return spark.createDataFrame([], schema)
    return spark.read.schema(schema).parquet(*files)


def run_snapshot(
    spark: SparkSession, job: BackfillJob, *, epoch: int | None = None, parallelism: int | None = None
) -> SnapshotResult:
    """Create the MV as of `epoch` (default: the upstream's latest); a no-op if it exists."""
    started = time.monotonic()
    parallelism = parallelism or job.backfill_parallelism
    plan = plan_query(job.query, job.primary_key)
    existing = read_watermark(job.target, job.app_id)
    if existing is not None:
        log.info("MV %s already exists at watermark %s: snapshot skipped", job.target, existing)
        return SnapshotResult(existing, 0, True, time.monotonic() - started)
    upstream = check_upstream(job.source, epoch)
    log.info("snapshot of %s pinned at epoch %s, parallelism %s", job.source, upstream.version, parallelism)
    job_state.update_state(
        job.target, phase=job_state.PHASE_SNAPSHOT, state=job_state.STATE_CREATING,
        pinned_epoch=upstream.version, parallelism=parallelism,
    )
    spark.conf.set("spark.sql.shuffle.partitions", str(parallelism))
    mv_rows = apply_query(spark, read_upstream_snapshot(spark, upstream), plan.query)
    data_dir = os.path.join(job.target, "data", f"snapshot-e{upstream.version}-{uuid.uuid4().hex[:12]}")
    mv_rows.write.parquet(data_dir)
    actions, rows = add_actions_for(job.target, data_dir)
    info = CommitInfo(phase=job_state.PHASE_SNAPSHOT, epoch=upstream.version, parallelism=parallelism, rows=rows)
    create_mv(job, _arrow_schema(mv_rows), actions, info)
    seconds = time.monotonic() - started
    job_state.update_state(
        job.target, phase=job_state.PHASE_SNAPSHOT, snapshot_epoch=upstream.version,
        snapshot_rows=rows, snapshot_seconds=round(seconds, 3),
    )
    log.info("snapshot done: %s rows at epoch %s in %.1fs (%.0f rows/s)", rows, upstream.version,
             seconds, rows / seconds if seconds else 0.0)
    return SnapshotResult(upstream.version, rows, False, seconds)


def _arrow_schema(frame: DataFrame):
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(frame.schema, timezone="UTC")
