"""Snapshot of a join MV: the join at a pinned vector, in resumable chunks.

Every upstream is pinned at a version (the vector `pin_epoch` chose, else each one's
latest) and read as of it. The chunks are those of the largest upstream among the ones
present in every output row (the root and the tables INNER-joined to it), so every
output row comes from exactly one chunk: each chunk's rows are joined with the other
upstreams along the tree, each read only over the range of join keys the chunk holds
(file skipping), and the query's output (or an aggregate's partial state) is appended
in one idempotent commit per chunk, as a one-upstream snapshot does: the phase's
sequence is `snapshot_chunks.skeleton`'s, and `JoinSnapshot` says what a join does its
own way. The last commit records the vector (`watermarks`). A stateless join's MV key rests on the
upstreams' keys: before that commit, the chunks written are proved to hold each MV key
once (`verify_primary_key`), or removed. A stateless join with a WHERE read in one chunk
skips the chunk commit: its rows are cached, proved and written once, in the commit that
creates the MV with the vector.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_backfill.engine.control import effective_settings, wait_while_paused
from airflow_backfill.engine.delta.commits import CommitInfo, append
from airflow_backfill.engine.delta.key_range import table_rows
from airflow_backfill.engine.delta.log import UpstreamInfo, check_upstream, table_exists
from airflow_backfill.engine.delta.vacuumed import check_not_vacuumed
from airflow_backfill.engine.faults import maybe_crash
from airflow_backfill.engine.feed_readers import feed_reader_properties
from airflow_backfill.engine.joins.recompute import repeated_join_key
from airflow_backfill.engine.joins.relation import chunk_joined, flat_rows, flat_schema, reader
from airflow_backfill.engine.joins.rounds import check_upstreams, join_plan
from airflow_backfill.engine.joins.watermarks import Vector, committed_vector, vector_metadata, vector_sum
from airflow_backfill.engine.planning.aggregate_sql import quote
from airflow_backfill.engine.rounds.changes import apply_query
from airflow_backfill.engine.rounds.plan_choice import SNAPSHOT_PARALLELISM, SNAPSHOT_UPSTREAM_ROWS
from airflow_backfill.engine.snapshot_chunks.plan import Chunk, list_data_files
from airflow_backfill.engine.snapshot_chunks.progress import (
    DoneChunk,
    SnapshotProgress,
    discard_progress,
    save_progress,
)
from airflow_backfill.engine.snapshot_chunks.run import PHASE, discard_uncreated_mv, read_files
from airflow_backfill.engine.snapshot_chunks.skeleton import Committed, Pinned, SnapshotKind
from airflow_backfill.exceptions import UnsupportedQueryError
from airflow_backfill.storage.files import exists

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from airflow_backfill.engine.joins.relation import Reader
    from airflow_backfill.engine.planning.join_query import JoinPlan
    from airflow_backfill.job import BackfillJob

log = logging.getLogger(__name__)


class JoinSnapshot(SnapshotKind[Vector]):
    """A snapshot of a join at a vector of versions, chunked by its largest core upstream,
    whose MV key is proved over the chunks' output before the last commit."""

    def __init__(self, spark: SparkSession, job: BackfillJob, epochs: Mapping[str, int] | None,
                 parallelism: int | None) -> None:
        self.spark, self.job, self.epochs, self.parallelism = spark, job, epochs, parallelism
        self._plan: JoinPlan | None = None

    def check(self) -> None:
        job, epochs = self.job, self.epochs
        if epochs is not None and sorted(epochs) != sorted(u.name for u in job.upstreams):
            raise UnsupportedQueryError(
                f"the pinned versions name {sorted(epochs)}, but the job's sources are "
                f"{sorted(u.name for u in job.upstreams)}; pin a version of each."
            )
        check_upstreams(job, epochs)
        join_plan(job, epochs)

    def committed(self) -> Committed | None:
        existing = committed_vector(self.job)
        return None if existing is None else Committed(vector_sum(existing), existing)

    def resume(self, progress: SnapshotProgress) -> Vector | None:
        if sorted(progress.epochs) != sorted(u.name for u in self.job.upstreams):
            return None
        if self.epochs is not None and dict(self.epochs) != progress.epochs:
            log.info("resuming the unfinished snapshot at versions %s instead of starting one at %s; "
                     "catch-up covers the versions in between", progress.epochs, dict(self.epochs))
        return _readable(self.job, check_upstreams(self.job, progress.epochs))

    def pin(self) -> Vector:
        return _readable(self.job, check_upstreams(self.job, self.epochs))

    def upstreams(self, pin: Vector) -> Pinned:
        spark, job = self.spark, self.job
        plan = self._plan = join_plan(job, pin)
        read = reader(spark, job, plan, pin)
        source = flat_schema(plan, {table.name: read(i).schema for i, table in enumerate(plan.tables)})
        schema = _mv_schema(spark, plan, source)
        upstreams = {u.name: check_upstream(u.table, pin[u.name]) for u in job.upstreams}
        chunked = _chunked_table(plan, upstreams)
        info = upstreams[plan.tables[chunked].name]
        return Pinned(
            epoch=vector_sum(pin), epochs=pin, plan=plan.flat, upstreams=upstreams,
            chunked=plan.tables[chunked].name, chunk_key=plan.tables[chunked].primary_key[0], source=source,
            schema=schema, metadata=vector_metadata(job, pin),
            rows=lambda chunk, several: chunk_source(spark, plan, read, info, chunk, chunked, bounded=several),
        )

    def create_at_once(self, pinned: Pinned, chunks: list[Chunk], progress: SnapshotProgress,
                       chunk_bytes: int) -> int | None:
        if not _in_one_commit(self._join(), chunks, progress, chunk_bytes):
            return None
        return _create_in_one_commit(self.spark, self.job, self._join(), pinned.epochs, progress, self.parallelism,
                                     pinned.rows(chunks[0], False))

    def prove_key_last(self, pinned: Pinned) -> None:
        _prove_mv_key(self.spark, self.job, self._join(), pinned.epochs)

    def finished_state(self, pinned: Pinned, whole: bool) -> dict[str, Any]:
        if not whole:
            return {}
        return {SNAPSHOT_UPSTREAM_ROWS: {name: table_rows(u.uri, u.version) for name, u in pinned.upstreams.items()},
                SNAPSHOT_PARALLELISM: effective_settings(self.job, self.parallelism).backfill_parallelism}

    def _join(self) -> JoinPlan:
        if self._plan is None:
            raise RuntimeError("the join's upstreams are not pinned yet")
        return self._plan


def _readable(job: BackfillJob, vector: Vector) -> Vector:
    """`vector` once each upstream's version in it is known to be whole (no file vacuumed)."""
    for upstream in job.upstreams:
        check_not_vacuumed(upstream.table, vector[upstream.name])
    return vector


def _mv_schema(spark: SparkSession, plan: JoinPlan, source: StructType) -> StructType:
    """The MV's schema, from Spark's analysis of the flat query (errors before any write)."""
    from pyspark.errors import AnalysisException

    try:
        return apply_query(spark, spark.createDataFrame([], source), plan.flat.query).schema
    except AnalysisException as error:
        raise UnsupportedQueryError(f"Spark cannot analyse the query over the joined upstreams: {error}") from None


def _chunked_table(plan: JoinPlan, upstreams: Mapping[str, UpstreamInfo]) -> int:
    """The largest table present in every output row (its rows split the output)."""
    def size(index: int) -> int:
        info = upstreams[plan.tables[index].name]
        return sum(f.size for f in list_data_files(info.uri, info.version))

    return max(plan.core(), key=lambda index: (size(index), -index))


def _in_one_commit(plan: JoinPlan, chunks: list[Chunk], progress: SnapshotProgress, chunk_bytes: int) -> bool:
    """Whether a stateless join's snapshot is one chunk, with no chunk written yet, whose
    query keeps only some rows (a WHERE): its rows are then cached, proved and written
    once, in the commit that creates the MV with its watermark. Caching every row of an
    unfiltered join costs more than the commit it saves (docs/benchmarks.md)."""
    return (plan.flat.aggregate is None and plan.flat.filters_rows and len(chunks) == 1 and not progress.done
            and chunks[0].size <= chunk_bytes)


def _create_in_one_commit(spark: SparkSession, job: BackfillJob, plan: JoinPlan, vector: Mapping[str, int],
                          progress: SnapshotProgress, parallelism: int | None, source: DataFrame) -> int:
    """The MV from its only chunk in one commit that also records the watermark: the rows
    are cached, their MV key proved and counted before anything is written, so neither a
    chunk commit nor a second commit for the watermark is needed (each costs Delta a
    state rebuild of the new table, 1 - 1.5 s of a 3 s snapshot at SF 1). The commit is
    idempotent by the MV's own app transaction; a run killed before it left nothing."""
    wait_while_paused(job)
    settings = effective_settings(job, parallelism)
    started = time.monotonic()
    rows = apply_query(spark, source, plan.flat.query).cache()
    try:
        if job.verify_primary_key:
            _refuse_repeated_key(job, plan, vector, rows.select(*(quote(c) for c in plan.mv_key)))
        count = rows.count()
        metadata = {"chunks": "1", "chunk_parallelism": str(settings.backfill_parallelism),
                    **vector_metadata(job, vector)}
        info = CommitInfo(phase=PHASE, epoch=progress.epoch, parallelism=settings.backfill_parallelism, rows=count,
                          extra=metadata)
        append(rows.coalesce(settings.backfill_parallelism), job.target, app_id=job.app_id, version=progress.epoch,
               user_metadata=info.user_metadata(job), create=True, table_properties=feed_reader_properties(job),
               laid_out_by=plan.mv_key)
    finally:
        rows.unpersist()
    progress.done[0] = DoneChunk(index=0, rows_in=progress.rows_total, rows_out=count,
                                 seconds=round(time.monotonic() - started, 3),
                                 parallelism=settings.backfill_parallelism, run_id=uuid.uuid4().hex[:12],
                                 bytes_in=progress.bytes_total)
    save_progress(job.target, progress)
    log.info("created join MV %s at versions %s with %s rows in one commit", job.target, dict(vector), count)
    maybe_crash(PHASE, "after_commit")
    return count


def _prove_mv_key(spark: SparkSession, job: BackfillJob, plan: JoinPlan, vector: Mapping[str, int]) -> None:
    """Refuse a stateless join whose chunks hold an MV key twice, before the commit that
    would create the MV (its chunks are then removed: no MV is left behind).

    The MV key rests on the upstreams' keys; proving it on the output (one shuffle of the
    MV's key columns) covers what they must guarantee at the pinned versions, at a
    fraction of proving every upstream's key over all of its rows. A repeated key whose
    rows join nothing yet is caught by the round that first joins it. An aggregate's
    signed sums need no unique key.
    """
    if plan.flat.aggregate is not None:
        return
    if not job.verify_primary_key:
        log.info("MV key uniqueness not verified (verify_primary_key: false)")
        return
    if not table_exists(job.target):
        return  # no chunk wrote a row (the folder may hold the job's state already)
    keys = spark.read.format("delta").load(job.target).select(*(quote(c) for c in plan.mv_key))
    _refuse_repeated_key(job, plan, vector, keys)


def _refuse_repeated_key(job: BackfillJob, plan: JoinPlan, vector: Mapping[str, int], keys: DataFrame) -> None:
    """Raise when `keys` (the MV key columns of the join's rows) hold a key twice, after
    removing the chunks written so far and the snapshot's progress."""
    repeated = repeated_join_key(job, plan, vector, keys)
    if repeated is None:
        return
    if exists(job.target):
        discard_uncreated_mv(job.target)
    discard_progress(job.target)
    raise repeated


def chunk_source(spark: SparkSession, plan: JoinPlan, read: Reader, info: UpstreamInfo, chunk: Chunk,
                 chunked: int, *, bounded: bool = True) -> DataFrame:
    """The flat relation of one chunk: its rows joined with the other upstreams, each read
    over the range of join keys the chunk holds (not `bounded`: the only chunk, whose range
    is every key, so the scan for it is skipped)."""
    return chunk_joined(plan, chunked, flat_rows(read_files(spark, info, chunk), plan, chunked), read, bounded=bounded)
