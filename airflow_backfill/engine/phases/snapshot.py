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

import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_backfill.engine import job_state
from airflow_backfill.engine.aggregates.snapshot import (
    chunk_query,
    commit_aggregate_snapshot,
    discard_partials,
    partials_uri,
)
from airflow_backfill.engine.control import effective_settings, wait_while_paused
from airflow_backfill.engine.delta.commits import CommitInfo, append, commit_watermark_only
from airflow_backfill.engine.delta.log import (
    METADATA_PREFIX,
    UpstreamInfo,
    check_upstream,
    commit_history,
    commit_metadata,
    load_table,
    read_watermark,
    rows_written,
    snapshot_app_id,
    table_exists,
)
from airflow_backfill.engine.faults import maybe_crash
from airflow_backfill.engine.feed_readers import feed_reader_properties
from airflow_backfill.engine.phases.changes import apply_query, duplicate_key
from airflow_backfill.engine.phases.repeated_keys import held_times, key_proved_from_files
from airflow_backfill.engine.phases.snapshot_chunks import (
    Chunk,
    default_chunk_bytes,
    file_order,
    list_data_files,
    plan_chunks,
)
from airflow_backfill.engine.phases.snapshot_progress import (
    DoneChunk,
    SnapshotProgress,
    discard_progress,
    load_progress,
    save_progress,
)
from airflow_backfill.engine.planning.aggregate_sql import quote
from airflow_backfill.engine.planning.query import QueryPlan, plan_query
from airflow_backfill.engine.rate_limit import pace
from airflow_backfill.engine.writer_lock import writer_lock
from airflow_backfill.exceptions import BackfillError, RepeatedKeyError, UnsupportedQueryError
from airflow_backfill.storage import files
from airflow_backfill.storage.spark_parquet import read_parquet_files
from airflow_backfill.storage.uri import join

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
    check_upstream(job.source)  # bad input fails here, before anything is written
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
        _discard_chunks(job, plan)
        progress = SnapshotProgress(
            epoch=upstream.version, chunks_total=len(chunks),
            rows_total=sum(c.rows for c in chunks), files_total=sum(len(c.files) for c in chunks),
            bytes_total=sum(c.size for c in chunks), file_order=order,
        )
        save_progress(job.target, progress)
    progress.key_proved = key_proved  # saved with the reconciled chunks
    _reconcile_with_log(job, plan, progress, chunks)
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
        chunks_run = _run_chunks(spark, job, plan, chunks, progress, parallelism, started,
                                 lambda chunk: read_files(spark, upstream, chunk))
    rows = _commit_snapshot(spark, job, plan, progress, from_arrow_schema(upstream.schema), output_schema,
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
            return check_upstream(job.source, progress.epoch), progress
        except BackfillError as error:
            log.warning("cannot resume the snapshot at epoch %s (%s); starting over", progress.epoch, error)
            discard_progress(job.target)
    return check_upstream(job.source, epoch), None


def chunk_table(job: BackfillJob, plan: QueryPlan) -> str:
    """Where the snapshot's chunks are appended: the MV itself, or an aggregate's partials."""
    return job.target if plan.aggregate is None else partials_uri(job.target)


def _committed_chunks(job: BackfillJob, plan: QueryPlan) -> int:
    """How many chunks the chunk table's log says are committed (they commit in order)."""
    uri = chunk_table(job, plan)
    if not table_exists(uri):
        return 0
    return int(load_table(uri).transaction_version(snapshot_app_id(job.app_id)) or 0)


def _reconcile_with_log(job: BackfillJob, plan: QueryPlan, progress: SnapshotProgress, chunks: list[Chunk]) -> None:
    """The log decides which chunks are done: a chunk committed by a run killed before it
    recorded the chunk is taken as done (its facts read back from its commit)."""
    committed = _committed_chunks(job, plan)
    recorded = {entry.get("chunk"): entry for entry in _chunk_commits(chunk_table(job, plan), committed)}
    for chunk in chunks[:committed]:
        if chunk.index not in progress.done:
            entry = recorded.get(str(chunk.index), {})
            progress.done[chunk.index] = DoneChunk(
                index=chunk.index, rows_in=chunk.rows, rows_out=int(entry.get("rows", 0)),
                seconds=float(entry.get("seconds", 0.0)), parallelism=int(entry.get("parallelism", 0)),
                run_id=str(entry.get("run_id", "")),
            )
    for index in [index for index in progress.done if index >= committed]:
        del progress.done[index]  # recorded but not in the log: redo it
    save_progress(job.target, progress)


def _chunk_commits(uri: str, committed: int) -> list[dict]:
    """The metadata of the chunk commits in the chunk table's recent history."""
    if not committed:
        return []
    entries = [commit_metadata(commit) for commit in commit_history(uri, limit=committed + 1)]
    return [entry for entry in entries if "chunk" in entry]


def _discard_chunks(job: BackfillJob, plan: QueryPlan) -> None:
    """Forget the chunks of an abandoned snapshot plan (the MV has no watermark yet)."""
    if plan.aggregate is not None:
        discard_partials(job.target)
        return
    if table_exists(job.target) and read_watermark(job.target, job.app_id) is None:
        discard_uncreated_mv(job.target)


def discard_uncreated_mv(target: str) -> None:
    """Delete an MV that never got a watermark (its chunks only); the job's folder stays."""
    for name in files.list_names(target):
        if name != job_state.STATE_DIR:
            files.delete(join(target, name))
    log.info("removed the chunks of an unfinished snapshot from %s", target)


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
    """The rows of one chunk, read with the upstream's Delta schema.

    Plain Parquet reads of the files the log lists at the epoch; an upstream with
    deletion vectors is read through Delta's time travel instead (as one chunk).
    """
    from pyspark.sql.pandas.types import from_arrow_schema

    if upstream.deletion_vectors:
        return spark.read.format("delta").option("versionAsOf", upstream.version).load(upstream.uri)
    return read_parquet_files(spark, from_arrow_schema(upstream.schema), [f.path for f in chunk.files])


def _run_chunk(
    spark: SparkSession, job: BackfillJob, plan: QueryPlan, source: DataFrame, chunk: Chunk,
    progress: SnapshotProgress, run_id: str, parallelism: int | None,
) -> None:
    """Query one chunk (`source`: its rows, bound as the query's `source`) and append its
    output to the chunk table in one idempotent commit."""
    settings = effective_settings(job, parallelism)
    started = time.monotonic()
    rows = apply_query(spark, source, chunk_query(plan))
    uri = chunk_table(job, plan)
    facts = {"chunk": str(chunk.index), "epoch": str(progress.epoch), "rows_in": str(chunk.rows),
             "parallelism": str(settings.backfill_parallelism), "run_id": run_id}
    append(rows.coalesce(settings.backfill_parallelism), uri, app_id=snapshot_app_id(job.app_id),
           version=chunk.index + 1, create=not table_exists(uri),
           user_metadata=json.dumps({METADATA_PREFIX + key: value for key, value in facts.items()}),
           table_properties=feed_reader_properties(job) if uri == job.target else None)
    progress.done[chunk.index] = DoneChunk(
        index=chunk.index, rows_in=chunk.rows, rows_out=rows_written(uri),
        seconds=round(time.monotonic() - started, 3), parallelism=settings.backfill_parallelism, run_id=run_id,
        bytes_in=chunk.size,
    )
    save_progress(job.target, progress)
    pace(chunk.rows, time.monotonic() - started, settings.rate_limit)


def aggregate_in_one_chunk(plan: QueryPlan, chunks: list[Chunk], progress: SnapshotProgress) -> bool:
    """Whether an aggregate's snapshot is one chunk with nothing written yet: its partial
    state then goes straight into the state table, without the partials table (one Delta
    table created, written and read back less; a run killed before the state commit left
    nothing, so the rerun starts the chunk again)."""
    return plan.aggregate is not None and len(chunks) == 1 and not progress.done


def only_chunk_partials(spark: SparkSession, job: BackfillJob, plan: QueryPlan, chunk: Chunk,
                        progress: SnapshotProgress, parallelism: int | None, source: DataFrame) -> DataFrame:
    """The partial state of the snapshot's only chunk (lazy), recorded in `progress` as done
    for the commit's metadata; the progress is saved once the MV is committed."""
    wait_while_paused(job)
    settings = effective_settings(job, parallelism)
    progress.done[chunk.index] = DoneChunk(
        index=chunk.index, rows_in=chunk.rows, rows_out=0, seconds=0.0, parallelism=settings.backfill_parallelism,
        run_id=uuid.uuid4().hex[:12], bytes_in=chunk.size,
    )
    return apply_query(spark, source, chunk_query(plan))


def _run_chunks(
    spark: SparkSession, job: BackfillJob, plan: QueryPlan, chunks: list[Chunk], progress: SnapshotProgress,
    parallelism: int | None, started: float, source: Callable[[Chunk], DataFrame],
) -> int:
    """Run the chunks not done yet, in order (`source`: a chunk's rows, bound as the
    query's `source`); returns how many ran."""
    run_id = uuid.uuid4().hex[:12]
    chunks_run = 0
    for chunk in chunks:
        if chunk.index in progress.done:
            continue
        wait_while_paused(job)
        _run_chunk(spark, job, plan, source(chunk), chunk, progress, run_id, parallelism)
        chunks_run += 1
        _log_progress(progress, started)
        maybe_crash(PHASE, f"after_chunks={len(progress.done)}")
    return chunks_run


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
    spark: SparkSession, job: BackfillJob, plan: QueryPlan, progress: SnapshotProgress, source: StructType,
    schema: StructType, metadata: Mapping[str, str] | None = None, partials: DataFrame | None = None,
) -> int:
    """Record watermark `E` on the MV (the commit that makes it exist for readers).

    `source`: the schema of the query's `source`; `metadata`: more commit metadata (a
    join's upstreams and vector); `partials`: an aggregate's only chunk's partial state
    (`only_chunk_partials`), else the partials table holds the chunks'."""
    done = [progress.done[index] for index in sorted(progress.done)]
    parallelism = done[-1].parallelism if done else job.backfill_parallelism
    extra = {"chunks": str(len(done)), "chunk_parallelism": ",".join(str(c.parallelism) for c in done),
             **(metadata or {})}
    if plan.aggregate is not None:
        info = CommitInfo(phase=PHASE, epoch=progress.epoch, parallelism=parallelism, rows=0, extra=extra)
        rows = commit_aggregate_snapshot(spark, job, plan, source, schema, info, partials)
        if partials is not None:
            save_progress(job.target, progress)
        maybe_crash(PHASE, "after_commit")
        return rows
    rows = sum(chunk.rows_out for chunk in done)
    maybe_crash(PHASE, "after_write")
    info = CommitInfo(phase=PHASE, epoch=progress.epoch, parallelism=parallelism, rows=rows, extra=extra)
    if table_exists(job.target):
        commit_watermark_only(spark, job.target, app_id=job.app_id, version=progress.epoch,
                              user_metadata=info.user_metadata(job))
    else:  # an empty upstream: no chunk created the table
        append(spark.createDataFrame([], schema), job.target, app_id=job.app_id, version=progress.epoch,
               user_metadata=info.user_metadata(job), create=True, table_properties=feed_reader_properties(job))
    log.info("created MV %s at epoch %s with %s rows", job.target, progress.epoch, rows)
    maybe_crash(PHASE, "after_commit")
    return rows


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
