"""Phase 1, snapshot: the MV query over the upstream as of one pinned epoch.

Spark reads the upstream's Parquet files as listed by the Delta log at epoch `E` (never
the live directory, which keeps changing), chunk by chunk. Each chunk's output is
written and recorded as done before the next starts, so a crash costs at most the chunk
in flight. When every chunk is done, delta-rs creates the MV in a single commit whose
watermark is `E`: until then the MV does not exist for readers, and files of crashed
attempts are never referenced and are removed on the next run. The upstream is only
read, so it keeps committing meanwhile. For an aggregate, a chunk's output is the
partial per-group state of its files, combined at commit (`aggregate_snapshot`).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_backfill.engine import job_state
from airflow_backfill.engine.aggregate_snapshot import chunk_query, commit_aggregate_snapshot
from airflow_backfill.engine.changes import apply_query
from airflow_backfill.engine.control import effective_settings, wait_while_paused
from airflow_backfill.engine.delta_log import UpstreamInfo, check_upstream, read_watermark
from airflow_backfill.engine.faults import maybe_crash
from airflow_backfill.engine.mv_commit import CommitInfo, add_actions_for, create_mv
from airflow_backfill.engine.query import QueryPlan, plan_query
from airflow_backfill.engine.rate_limit import pace
from airflow_backfill.engine.snapshot_chunks import (
    DEFAULT_CHUNK_BYTES,
    Chunk,
    list_upstream_files,
    plan_chunks,
)
from airflow_backfill.engine.snapshot_progress import (
    DoneChunk,
    SnapshotProgress,
    discard_progress,
    epoch_dir,
    load_progress,
    remove_unrecorded_output,
    save_progress,
)
from airflow_backfill.engine.writer_lock import writer_lock
from airflow_backfill.exceptions import BackfillError, UnsupportedQueryError, UpstreamError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from airflow_backfill.job import BackfillJob

log = logging.getLogger(__name__)

PHASE = job_state.PHASE_SNAPSHOT


@dataclass(frozen=True)
class SnapshotResult:
    epoch: int
    rows: int
    skipped: bool
    seconds: float
    chunks_run: int = 0
    """Chunks this run processed (a resumed run skips the chunks already done)."""


def run_snapshot(
    spark: SparkSession,
    job: BackfillJob,
    *,
    epoch: int | None = None,
    parallelism: int | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> SnapshotResult:
    """Create the MV as of `epoch` (default: the upstream's latest); a no-op if it exists."""
    plan = plan_query(job.query, job.primary_key)
    check_upstream(job.source)  # bad input fails here, before anything is written
    with writer_lock(job.target, job.name, PHASE):
        return _snapshot(spark, job, plan, epoch, parallelism, chunk_bytes)


def _snapshot(
    spark: SparkSession, job: BackfillJob, plan: QueryPlan, epoch: int | None,
    parallelism: int | None, chunk_bytes: int,
) -> SnapshotResult:
    started = time.monotonic()
    existing = read_watermark(job.target, job.app_id)
    if existing is not None:
        log.info("MV %s already exists at watermark %s: snapshot skipped", job.target, existing)
        return SnapshotResult(existing, 0, True, time.monotonic() - started)
    upstream, progress = _pin_epoch(job, epoch)
    output_schema = mv_schema(spark, upstream, plan)
    chunks = plan_chunks(list_upstream_files(job.source, upstream.version), chunk_bytes)
    if progress is None or progress.chunks_total != len(chunks):
        progress = SnapshotProgress(
            epoch=upstream.version, chunks_total=len(chunks),
            rows_total=sum(c.rows for c in chunks), files_total=sum(len(c.files) for c in chunks),
            bytes_total=sum(c.size for c in chunks),
        )
        save_progress(job.target, progress)
    removed = remove_unrecorded_output(job.target, progress)
    if removed:
        log.info("removed %s output folder(s) of crashed attempts", len(removed))
    job_state.update_state(job.target, phase=PHASE, state=job_state.STATE_CREATING, pinned_epoch=upstream.version)
    log.info(
        "snapshot of %s at epoch %s: %s chunks (%s already done), %s rows in %s files",
        job.source, upstream.version, len(chunks), len(progress.done), progress.rows_total, progress.files_total,
    )
    run_id = uuid.uuid4().hex[:12]
    chunks_run = 0
    for chunk in chunks:
        if chunk.index in progress.done:
            continue
        wait_while_paused(job)
        _run_chunk(spark, job, plan, upstream, chunk, progress, run_id, parallelism)
        chunks_run += 1
        _log_progress(progress, started)
        maybe_crash(PHASE, f"after_chunks={len(progress.done)}")
    rows = _commit_snapshot(spark, job, plan, progress, upstream, output_schema)
    seconds = time.monotonic() - started
    job_state.update_state(
        job.target, phase=PHASE, snapshot_epoch=upstream.version, snapshot_rows=rows,
        snapshot_seconds=round(seconds, 3),
    )
    log.info("snapshot done: %s rows at epoch %s in %.1fs", rows, upstream.version, seconds)
    return SnapshotResult(upstream.version, rows, False, seconds, chunks_run)


def _pin_epoch(job: BackfillJob, epoch: int | None) -> tuple[UpstreamInfo, SnapshotProgress | None]:
    """The epoch to snapshot: an unfinished snapshot's epoch wins, so its chunks are reused."""
    progress = load_progress(job.target)
    if progress is not None:
        if epoch is not None and epoch != progress.epoch:
            log.info("resuming the unfinished snapshot at epoch %s instead of starting one at %s; "
                     "catch-up covers the epochs in between", progress.epoch, epoch)
        try:
            return check_upstream(job.source, progress.epoch), progress
        except BackfillError as error:
            log.warning("cannot resume the snapshot at epoch %s (%s); starting over", progress.epoch, error)
            discard_progress(job.target)
            remove_unrecorded_output(job.target, None)
    return check_upstream(job.source, epoch), None


def mv_schema(spark: SparkSession, upstream: UpstreamInfo, plan: QueryPlan) -> StructType:
    """The MV's schema, from Spark's analysis of the query (errors surface before any write)."""
    from pyspark.errors import AnalysisException
    from pyspark.sql.pandas.types import from_arrow_schema

    empty = spark.createDataFrame([], from_arrow_schema(upstream.schema))
    try:
        return apply_query(spark, empty, plan.query).schema
    except AnalysisException as error:
        raise UnsupportedQueryError(f"Spark cannot analyse the query over the upstream: {error}") from None


def read_files(spark: SparkSession, upstream: UpstreamInfo, chunk: Chunk) -> DataFrame:
    """The rows of one chunk, read with the upstream's Delta schema."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return spark.read.schema(from_arrow_schema(upstream.schema)).parquet(*(f.path for f in chunk.files))


def _run_chunk(
    spark: SparkSession, job: BackfillJob, plan: QueryPlan, upstream: UpstreamInfo, chunk: Chunk,
    progress: SnapshotProgress, run_id: str, parallelism: int | None,
) -> None:
    settings = effective_settings(job, parallelism)
    started = time.monotonic()
    out_dir = os.path.join(epoch_dir(job.target, progress.epoch), f"chunk-{chunk.index:05d}-{run_id}")
    rows = apply_query(spark, read_files(spark, upstream, chunk), chunk_query(plan))
    rows.coalesce(settings.backfill_parallelism).write.parquet(out_dir)
    _, rows_out = add_actions_for(job.target, out_dir)
    progress.done[chunk.index] = DoneChunk(
        index=chunk.index, data_dir=os.path.relpath(out_dir, job.target), rows_in=chunk.rows,
        rows_out=rows_out, seconds=round(time.monotonic() - started, 3),
        parallelism=settings.backfill_parallelism, run_id=run_id,
        bytes_in=chunk.size,
    )
    save_progress(job.target, progress)
    pace(chunk.rows, time.monotonic() - started, settings.rate_limit)


def _log_progress(progress: SnapshotProgress, started: float) -> None:
    elapsed = time.monotonic() - started
    rate = progress.rows_done / elapsed if elapsed else 0.0
    remaining = progress.rows_total - progress.rows_done
    log.info(
        "snapshot progress: chunks %s/%s, rows %s/%s (%.0f rows/s, ETA %.0fs)",
        len(progress.done), progress.chunks_total, progress.rows_done, progress.rows_total, rate,
        remaining / rate if rate else 0.0,
    )


def _commit_snapshot(
    spark: SparkSession, job: BackfillJob, plan: QueryPlan, progress: SnapshotProgress, upstream: UpstreamInfo,
    schema: StructType,
) -> int:
    from pyspark.sql.pandas.types import to_arrow_schema

    done = [progress.done[index] for index in sorted(progress.done)]
    parallelism = done[-1].parallelism if done else job.backfill_parallelism
    extra = {"chunks": str(len(done)), "chunk_parallelism": ",".join(str(c.parallelism) for c in done)}
    if plan.aggregate is not None:
        info = CommitInfo(phase=PHASE, epoch=progress.epoch, parallelism=parallelism, rows=0, extra=extra)
        rows = commit_aggregate_snapshot(spark, job, plan, progress, upstream, schema, info)
        maybe_crash(PHASE, "after_commit")
        return rows
    if job.verify_primary_key:
        _refuse_duplicate_keys(spark, job, plan, done)
    else:
        log.info("primary-key uniqueness not verified (verify_primary_key: false)")
    actions, rows = [], 0
    for chunk in done:
        chunk_actions, chunk_rows = add_actions_for(job.target, os.path.join(job.target, chunk.data_dir))
        actions.extend(chunk_actions)
        rows += chunk_rows
    maybe_crash(PHASE, "after_write")
    info = CommitInfo(phase=PHASE, epoch=progress.epoch, parallelism=parallelism, rows=rows, extra=extra)
    create_mv(job, to_arrow_schema(schema, timezone="UTC"), actions, info)
    maybe_crash(PHASE, "after_commit")
    return rows


def _refuse_duplicate_keys(spark: SparkSession, job: BackfillJob, plan: QueryPlan, done: list[DoneChunk]) -> None:
    """The MV key must be unique; a duplicate means the upstream's key is not a key."""
    if not done:
        return
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    paths = [os.path.join(job.target, chunk.data_dir) for chunk in done]
    keys = spark.read.parquet(*paths).select(*plan.mv_key)
    # A count over a window partitioned by the key (one shuffle, then a sort) is about twice
    # as fast as a GROUP BY on keys that are nearly all distinct: partial aggregation
    # cannot shrink them, so its hash maps only cost memory.
    copies = F.count(F.lit(1)).over(Window.partitionBy(*plan.mv_key)).alias("count")
    duplicate = keys.select(*plan.mv_key, copies).filter(F.col("count") > 1).limit(1).collect()
    if duplicate:
        row = duplicate[0].asDict()
        count = row.pop("count")
        shutil.rmtree(os.path.dirname(paths[0]), ignore_errors=True)  # the whole epoch's output
        discard_progress(job.target)
        raise UpstreamError(
            f"primary key {list(job.primary_key)} is not unique in the upstream: MV key {row} appears "
            f"{count} times. Fix the upstream or declare its real primary key; nothing was committed."
        )
