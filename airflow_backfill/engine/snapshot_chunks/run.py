"""The snapshot's chunk loop, shared by one-upstream and join snapshots.

Each chunk's query output is appended to its chunk table (the MV itself, or an
aggregate's partials) in one idempotent commit (app transaction
`airflow_backfill/<job>/snapshot`, version = chunks committed), so a crash costs at most
the chunk in flight; the log, not the progress file, decides which chunks are done
(`reconcile_with_log`), and `commit_snapshot` makes the MV exist for readers by
recording its watermark. `phases/snapshot.py` and `joins/snapshot.py` plan the chunks
and call these steps.
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
from airflow_backfill.engine.rate_limit import pace
from airflow_backfill.engine.rounds.changes import apply_query
from airflow_backfill.engine.snapshot_chunks.plan import Chunk
from airflow_backfill.engine.snapshot_chunks.progress import DoneChunk, SnapshotProgress, save_progress
from airflow_backfill.storage import files
from airflow_backfill.storage.spark_parquet import read_parquet_files
from airflow_backfill.storage.uri import join

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from airflow_backfill.engine.planning.query import QueryPlan
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


def chunk_table(job: BackfillJob, plan: QueryPlan) -> str:
    """Where the snapshot's chunks are appended: the MV itself, or an aggregate's partials."""
    return job.target if plan.aggregate is None else partials_uri(job.target)


def committed_chunks(job: BackfillJob, plan: QueryPlan) -> int:
    """How many chunks the chunk table's log says are committed (they commit in order)."""
    uri = chunk_table(job, plan)
    if not table_exists(uri):
        return 0
    return int(load_table(uri).transaction_version(snapshot_app_id(job.app_id)) or 0)


def reconcile_with_log(job: BackfillJob, plan: QueryPlan, progress: SnapshotProgress, chunks: list[Chunk]) -> None:
    """The log decides which chunks are done: a chunk committed by a run killed before it
    recorded the chunk is taken as done (its facts read back from its commit)."""
    committed = committed_chunks(job, plan)
    recorded = {entry.get("chunk"): entry for entry in chunk_commits(chunk_table(job, plan), committed)}
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


def chunk_commits(uri: str, committed: int) -> list[dict]:
    """The metadata of the chunk commits in the chunk table's recent history."""
    if not committed:
        return []
    entries = [commit_metadata(commit) for commit in commit_history(uri, limit=committed + 1)]
    return [entry for entry in entries if "chunk" in entry]


def discard_chunks(job: BackfillJob, plan: QueryPlan) -> None:
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


def read_files(spark: SparkSession, upstream: UpstreamInfo, chunk: Chunk) -> DataFrame:
    """The rows of one chunk, read with the upstream's Delta schema.

    Plain Parquet reads of the files the log lists at the epoch; an upstream with
    deletion vectors is read through Delta's time travel instead (as one chunk).
    """
    from pyspark.sql.pandas.types import from_arrow_schema

    if upstream.deletion_vectors:
        return spark.read.format("delta").option("versionAsOf", upstream.version).load(upstream.uri)
    return read_parquet_files(spark, from_arrow_schema(upstream.schema), [f.path for f in chunk.files])


def run_chunk(
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
           table_properties=feed_reader_properties(job) if uri == job.target else None,
           laid_out_by=plan.mv_key if uri == job.target else ())
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


def run_chunks(
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
        run_chunk(spark, job, plan, source(chunk), chunk, progress, run_id, parallelism)
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


def commit_snapshot(
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
