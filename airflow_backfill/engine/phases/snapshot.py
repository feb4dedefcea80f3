"""Phase 1, snapshot: the MV query over the upstream as of one pinned epoch.

Spark reads the upstream's files as listed by the Delta log at epoch `E` (never the live
directory, which keeps changing), chunk by chunk, and appends each chunk's output to its
chunk table in one idempotent delta-spark commit (app transaction
`airflow_backfill/<job>/snapshot`, version = chunks committed), so a crash costs at most
the chunk in flight and a rerun skips what the log says is committed. For a stateless
query the chunk table is the MV itself; the snapshot ends with the commit that records
watermark `E`, and until then the MV has no watermark: the sensor, downstream jobs and
the checks treat it as not created. For an aggregate, a chunk's output is the partial
per-group state of its files, appended to a staging table and combined at commit
(`aggregate_snapshot`). The upstream is only read, so it keeps committing meanwhile. An
upstream with deletion vectors (for example another job's MV) is read through Delta as
one chunk, since its files alone are not its rows.

Files are planned in the order of their smallest key (`snapshot_chunks`), so the chunks
of an upstream written in key order cover disjoint key ranges, and so do the MV files
each chunk writes: a round whose changes fall in a key range reads only those files.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from airflow_backfill.engine import job_state
from airflow_backfill.engine.delta.key_proof import key_proved_from_files
from airflow_backfill.engine.delta.log import (
    UpstreamInfo,
    check_upstream,
    read_watermark,
    table_exists,
)
from airflow_backfill.engine.delta.vacuumed import check_not_vacuumed
from airflow_backfill.engine.downstream import register_downstream
from airflow_backfill.engine.planning.aggregate_sql import quote
from airflow_backfill.engine.planning.query import QueryPlan, plan_query
from airflow_backfill.engine.rounds.changes import apply_query, duplicate_key
from airflow_backfill.engine.rounds.key_check import held_times
from airflow_backfill.engine.snapshot_chunks.plan import (
    Chunk,
    default_chunk_bytes,
    file_order,
    list_data_files,
    plan_chunks,
)
from airflow_backfill.engine.snapshot_chunks.progress import (
    SnapshotProgress,
    discard_progress,
    load_progress,
    save_progress,
)
from airflow_backfill.engine.snapshot_chunks.run import (
    PHASE,
    SnapshotResult,
    aggregate_in_one_chunk,
    commit_snapshot,
    discard_chunks,
    discard_uncreated_mv,
    only_chunk_partials,
    read_files,
    reconcile_with_log,
    run_chunks,
)
from airflow_backfill.engine.writer_lock import writer_lock
from airflow_backfill.exceptions import BackfillError, RepeatedKeyError, ServiceError, UnsupportedQueryError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

    from airflow_backfill.job import BackfillJob

log = logging.getLogger(__name__)



def run_snapshot(
    spark: SparkSession,
    job: BackfillJob,
    *,
    epoch: int | None = None,
    parallelism: int | None = None,
    chunk_bytes: int | None = None,
    epochs: Mapping[str, int] | None = None,
) -> SnapshotResult:
    """Create the MV as of `epoch` (default: the upstream's latest); a no-op if it exists.

    A join's MV is created as of `epochs`, a version per upstream (default: each one's
    latest), by `engine/joins/snapshot.py`. `chunk_bytes`: upstream bytes per chunk
    (default `default_chunk_bytes`: larger for a join, whose chunks each read the other
    upstreams too).
    """
    if chunk_bytes is None:
        chunk_bytes = default_chunk_bytes(job.is_join)
    if job.is_join:
        from airflow_backfill.engine.joins.snapshot import run_join_snapshot

        return run_join_snapshot(spark, job, epochs=epochs, parallelism=parallelism, chunk_bytes=chunk_bytes)
    plan = plan_query(job.query, job.primary_key)
    check_upstream(job.source, key=job.primary_key)  # bad input fails here, before anything is written
    register_downstream(job)  # the upstream MV's rounds from here on are read by this job's catch-up
    with writer_lock(job.target, job.name, PHASE):
        return _snapshot(spark, job, plan, epoch, parallelism, chunk_bytes)


def _snapshot(
    spark: SparkSession, job: BackfillJob, plan: QueryPlan, epoch: int | None,
    parallelism: int | None, chunk_bytes: int,
) -> SnapshotResult:
    from pyspark.sql.pandas.types import from_arrow_schema

    started = time.monotonic()
    existing = read_watermark(job.target, job.app_id)
    if existing is not None:
        log.info("MV %s already exists at watermark %s: snapshot skipped", job.target, existing)
        return SnapshotResult(existing, 0, True, time.monotonic() - started)
    upstream, progress = _pin_epoch(job, epoch)
    output_schema = mv_schema(spark, upstream, plan)
    key_proved = progress is not None and progress.key_proved
    if key_proved:
        log.info("key proved unique at epoch %s by the run that planned this snapshot", upstream.version)
    else:
        key_proved = _prove_key(spark, job, plan, upstream)
    upstream_files = list_data_files(job.source, upstream.version, plan.upstream_key[0])
    chunks = plan_chunks(upstream_files, chunk_bytes)
    if upstream.deletion_vectors and len(chunks) > 1:
        chunks = [Chunk(0, tuple(f for c in chunks for f in c.files))]
    order = file_order(upstream_files)
    if progress is None or progress.chunks_total != len(chunks) or progress.file_order != order:
        discard_chunks(job, plan)
        progress = SnapshotProgress(
            epoch=upstream.version, chunks_total=len(chunks),
            rows_total=sum(c.rows for c in chunks), files_total=sum(len(c.files) for c in chunks),
            bytes_total=sum(c.size for c in chunks), file_order=order,
        )
        save_progress(job.target, progress)
    progress.key_proved = key_proved  # saved with the reconciled chunks
    reconcile_with_log(job, plan, progress, chunks)
    job_state.update_state(job.target, phase=PHASE, state=job_state.STATE_CREATING, pinned_epoch=upstream.version)
    log.info(
        "snapshot of %s at epoch %s: %s chunks (%s already done), %s rows in %s files",
        job.source, upstream.version, len(chunks), len(progress.done), progress.rows_total, progress.files_total,
    )
    partials = None
    if aggregate_in_one_chunk(plan, chunks, progress):
        partials = only_chunk_partials(spark, job, plan, chunks[0], progress, parallelism,
                                       read_files(spark, upstream, chunks[0]))
        chunks_run = 1
    else:
        chunks_run = run_chunks(spark, job, plan, chunks, progress, parallelism, started,
                                 lambda chunk: read_files(spark, upstream, chunk))
    rows = commit_snapshot(spark, job, plan, progress, from_arrow_schema(upstream.schema), output_schema,
                            partials=partials)
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
            return _readable(check_upstream(job.source, progress.epoch)), progress
        except ServiceError:  # the store failed, not the epoch: the chunks stay for a rerun
            raise
        except BackfillError as error:
            log.warning("cannot resume the snapshot at epoch %s (%s); starting over", progress.epoch, error)
            discard_progress(job.target)
    return _readable(check_upstream(job.source, epoch)), None


def _readable(upstream: UpstreamInfo) -> UpstreamInfo:
    """`upstream` once its version is known to be whole (no file of it vacuumed)."""
    check_not_vacuumed(upstream.uri, upstream.version)
    return upstream


def mv_schema(spark: SparkSession, upstream: UpstreamInfo, plan: QueryPlan) -> StructType:
    """The MV's schema, from Spark's analysis of the query (errors surface before any write)."""
    from pyspark.errors import AnalysisException
    from pyspark.sql.pandas.types import from_arrow_schema

    empty = spark.createDataFrame([], from_arrow_schema(upstream.schema))
    try:
        return apply_query(spark, empty, plan.query).schema
    except AnalysisException as error:
        raise UnsupportedQueryError(f"Spark cannot analyse the query over the upstream: {error}") from None


def _prove_key(spark: SparkSession, job: BackfillJob, plan: QueryPlan, upstream: UpstreamInfo) -> bool:
    """Refuse an upstream whose key is not unique at the pinned epoch, before any chunk is
    written; True when the key was proved. A stateless MV's key is the upstream's: a
    repeated key would become two MV rows, or, when the WHERE leaves one of them out, make
    later rounds net two upstream rows as one.

    The upstream's key columns are proved rather than the MV's, so that a second row which
    the query's WHERE leaves out is seen too. An aggregate's key is its groups: nothing to
    prove.
    """
    if plan.aggregate is not None:
        return False
    if not job.verify_primary_key:
        log.info("primary-key uniqueness not verified (verify_primary_key: false)")
        return False
    repeated = _upstream_key_repeated(spark, plan, upstream)
    if repeated is not None:
        if table_exists(job.target):
            discard_uncreated_mv(job.target)  # the chunks of an earlier, unproved attempt
        discard_progress(job.target)
        raise RepeatedKeyError(list(job.primary_key), job.source, repeated)
    return True


def _upstream_key_repeated(spark: SparkSession, plan: QueryPlan, upstream: UpstreamInfo) -> str | None:
    """Which upstream key the pinned epoch holds twice, if any: none when the files prove
    the key unique on the driver (`key_proved_from_files`), else counted by Spark over
    every file's key columns."""
    from pyspark.sql import functions as F

    if key_proved_from_files(upstream.uri, upstream.version, plan.upstream_key):
        return None
    every_file = Chunk(0, tuple(list_data_files(upstream.uri, upstream.version)))
    if not every_file.files:
        return None  # an empty upstream
    keys = read_files(spark, upstream, every_file).select(*(F.col(quote(column)) for column in plan.upstream_key))
    duplicate = duplicate_key(keys, plan.upstream_key)
    return None if duplicate is None else held_times(*duplicate, upstream.version)
