"""The snapshot phase's one sequence, for an MV over one upstream and over a join.

Every snapshot checks its inputs (errors before any write), takes the MV's writer lock,
skips when the MV exists, pins its epoch(s) or resumes the unfinished snapshot's, plans
the chunks of one upstream's files at the pinned version, runs the chunks its log does not
hold yet, commits the MV with its watermark and records the job's state. What differs
between one upstream and a join is a `SnapshotKind`: how the epochs are pinned and recorded
(one version, or a vector whose sum is the app transaction), what a chunk reads (the
upstream's files, or them joined with the other upstreams), and where the key is proved
(the upstream's key before the first chunk, or the join's output before the last commit).
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from airflow_backfill.engine import job_state
from airflow_backfill.engine.downstream import register_downstream
from airflow_backfill.engine.snapshot_chunks.plan import Chunk, file_order, list_data_files, plan_chunks
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
    only_chunk_partials,
    reconcile_with_log,
    run_chunks,
)
from airflow_backfill.engine.writer_lock import writer_lock
from airflow_backfill.exceptions import BackfillError, ServiceError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from airflow_backfill.engine.delta.log import UpstreamInfo
    from airflow_backfill.engine.planning.query import QueryPlan
    from airflow_backfill.job import BackfillJob

log = logging.getLogger(__name__)

Pin = TypeVar("Pin")
"""What a kind pins: an upstream's version, or a version per upstream."""

ChunkRows = Callable[[Chunk, bool], "DataFrame"]
"""The rows a chunk binds as the query's `source`; the flag says whether the snapshot has
several chunks (a join then reads the other upstreams over the chunk's key range only)."""


@dataclass(frozen=True)
class Committed:
    """The watermark of an MV that exists already."""

    epoch: int
    epochs: Mapping[str, int] = field(default_factory=dict)
    """A join's vector (`epoch` is its sum); empty for one upstream."""


@dataclass(frozen=True)
class Pinned:
    """A snapshot's upstreams at their pinned versions: what the sequence plans, runs and
    commits."""

    epoch: int
    """The watermark the MV's last commit records (a join: its vector's sum)."""
    plan: QueryPlan
    """The query over one `source` (a join's flat query)."""
    upstreams: Mapping[str, UpstreamInfo]
    """Each upstream at its pinned version, by name."""
    chunked: str
    """The upstream whose files are split into chunks."""
    chunk_key: str
    """The leading key column of that upstream, which orders its files."""
    source: StructType
    """The schema of the query's `source`."""
    schema: StructType
    """The MV's schema."""
    rows: ChunkRows
    epochs: Mapping[str, int] = field(default_factory=dict)
    """A join's vector; empty for one upstream."""
    metadata: Mapping[str, str] = field(default_factory=dict)
    """More metadata of the commit that records the watermark."""

    @property
    def chunked_upstream(self) -> UpstreamInfo:
        return self.upstreams[self.chunked]


class SnapshotKind(ABC, Generic[Pin]):
    """What a kind of snapshot does its own way; made for one run of one job."""

    @abstractmethod
    def check(self) -> None:
        """Refuse bad input before anything is written (no lock taken yet)."""

    @abstractmethod
    def committed(self) -> Committed | None:
        """The MV's watermark when it exists already (the snapshot is then a no-op)."""

    @abstractmethod
    def resume(self, progress: SnapshotProgress) -> Pin | None:
        """The pin of an unfinished snapshot, whose chunks are then reused; None when
        `progress` is not one this run can resume. Raises `BackfillError` when its
        versions can no longer be read whole."""

    @abstractmethod
    def pin(self) -> Pin:
        """The versions a new snapshot reads (the ones asked for, else the latest)."""

    @abstractmethod
    def upstreams(self, pin: Pin) -> Pinned:
        """The upstreams at `pin`, with the query analysed (errors before any write)."""

    def prove_key_first(self, pinned: Pinned, progress: SnapshotProgress | None) -> bool:
        """Prove the key before any chunk is written; True when proved (kept in the
        progress, so a resumed run does not prove it again)."""
        return False

    def create_at_once(self, pinned: Pinned, chunks: list[Chunk], progress: SnapshotProgress,
                       chunk_bytes: int) -> int | None:
        """Create the MV with its watermark in one commit instead of chunk commits; its
        rows, or None when this snapshot is not written that way."""
        return None

    def prove_key_last(self, pinned: Pinned) -> None:
        """Prove the key over the chunks written, before the commit that creates the MV."""

    def finished_state(self, pinned: Pinned, whole: bool) -> dict[str, Any]:
        """More job-state fields once the MV exists; `whole`: this run computed every chunk."""
        return {}


def run(spark: SparkSession, job: BackfillJob, kind: SnapshotKind[Any], *, parallelism: int | None,
        chunk_bytes: int) -> SnapshotResult:
    """The snapshot of `job` the way `kind` says; a no-op when the MV exists."""
    kind.check()  # bad input fails here, before anything is written
    register_downstream(job)  # an upstream MV's rounds from here on are read by this job's catch-up
    with writer_lock(job.target, job.name, PHASE):
        return _snapshot(spark, job, kind, parallelism, chunk_bytes)


def _snapshot(spark: SparkSession, job: BackfillJob, kind: SnapshotKind[Any], parallelism: int | None,
              chunk_bytes: int) -> SnapshotResult:
    started = time.monotonic()
    committed = kind.committed()
    if committed is not None:
        log.info("MV %s already exists at %s: snapshot skipped", job.target, named(committed.epoch, committed.epochs))
        return SnapshotResult(committed.epoch, 0, True, time.monotonic() - started)
    pin, progress = pin_or_resume(job, kind)
    pinned = kind.upstreams(pin)
    key_proved = kind.prove_key_first(pinned, progress)
    chunks, order = _chunks(pinned, chunk_bytes)
    progress = _planned(job, pinned, chunks, order, progress, key_proved)
    job_state.update_state(job.target, phase=PHASE, state=job_state.STATE_CREATING, pinned_epoch=pinned.epoch,
                           **_vector("pinned_epochs", pinned))
    log.info("snapshot of %s at %s: %s chunks of %s (%s already done), %s rows in %s files", job.name, named(pinned.epoch, pinned.epochs),
             len(chunks), pinned.chunked, len(progress.done), progress.rows_total, progress.files_total)
    rows, chunks_run = _run_and_commit(spark, job, kind, pinned, chunks, progress, parallelism, chunk_bytes,
                                       started)
    seconds = time.monotonic() - started
    job_state.update_state(job.target, phase=PHASE, snapshot_epoch=pinned.epoch, snapshot_rows=rows,
                           snapshot_seconds=round(seconds, 3), **_vector("snapshot_epochs", pinned),
                           **kind.finished_state(pinned, chunks_run == len(chunks)))
    log.info("snapshot done: %s rows at %s in %.1fs", rows, named(pinned.epoch, pinned.epochs), seconds)
    return SnapshotResult(pinned.epoch, rows, False, seconds, chunks_run)


def pin_or_resume(job: BackfillJob, kind: SnapshotKind[Pin]) -> tuple[Pin, SnapshotProgress | None]:
    """The pin to snapshot at: an unfinished snapshot's wins, so its chunks are reused; one
    whose versions can no longer be read is forgotten, unless the store failed (then its
    chunks stay for a rerun)."""
    progress = load_progress(job.target)
    if progress is not None:
        try:
            pin = kind.resume(progress)
        except ServiceError:  # the store failed, not the versions
            raise
        except BackfillError as error:
            log.warning("cannot resume the snapshot at %s (%s); starting over", named(progress.epoch, progress.epochs),
                        error)
            pin = None
        if pin is not None:
            return pin, progress
        discard_progress(job.target)
    return kind.pin(), None


def _chunks(pinned: Pinned, chunk_bytes: int) -> tuple[list[Chunk], str]:
    """The chunks of the chunked upstream's files, and the order they were taken in. An
    upstream with deletion vectors is read through Delta as one chunk, since its files
    alone are not its rows."""
    upstream = pinned.chunked_upstream
    files = list_data_files(upstream.uri, upstream.version, pinned.chunk_key)
    chunks = plan_chunks(files, chunk_bytes)
    if upstream.deletion_vectors and len(chunks) > 1:
        chunks = [Chunk(0, tuple(f for c in chunks for f in c.files))]
    return chunks, file_order(files)


def _planned(job: BackfillJob, pinned: Pinned, chunks: list[Chunk], order: str, progress: SnapshotProgress | None,
             key_proved: bool) -> SnapshotProgress:
    """The progress of this plan, reconciled with the MV's log: a resumed plan's, or a new
    one (and the chunks of another plan forgotten) when the chunks differ."""
    if progress is None or progress.chunks_total != len(chunks) or progress.file_order != order:
        discard_chunks(job, pinned.plan)
        progress = SnapshotProgress(
            epoch=pinned.epoch, chunks_total=len(chunks), rows_total=sum(c.rows for c in chunks),
            files_total=sum(len(c.files) for c in chunks), bytes_total=sum(c.size for c in chunks),
            file_order=order, epochs=dict(pinned.epochs),
        )
        save_progress(job.target, progress)
    progress.key_proved = key_proved  # saved with the reconciled chunks
    reconcile_with_log(job, pinned.plan, progress, chunks)
    return progress


def _run_and_commit(spark: SparkSession, job: BackfillJob, kind: SnapshotKind[Any], pinned: Pinned,
                    chunks: list[Chunk], progress: SnapshotProgress, parallelism: int | None, chunk_bytes: int,
                    started: float) -> tuple[int, int]:
    """Run the chunks not done and commit the MV with its watermark: (MV rows, chunks run)."""
    created = kind.create_at_once(pinned, chunks, progress, chunk_bytes)
    if created is not None:
        return created, 1
    several = len(chunks) > 1
    partials = None
    if aggregate_in_one_chunk(pinned.plan, chunks, progress):
        partials = only_chunk_partials(spark, job, pinned.plan, chunks[0], progress, parallelism,
                                       pinned.rows(chunks[0], several))
        chunks_run = 1
    else:
        chunks_run = run_chunks(spark, job, pinned.plan, chunks, progress, parallelism, started,
                                lambda chunk: pinned.rows(chunk, several))
    kind.prove_key_last(pinned)
    rows = commit_snapshot(spark, job, pinned.plan, progress, pinned.source, pinned.schema, pinned.metadata,
                           partials=partials)
    return rows, chunks_run


def named(epoch: int, epochs: Mapping[str, int]) -> str:
    """How logs name a pin: `epoch 7`, or a join's `versions {...}`."""
    return f"versions {dict(epochs)}" if epochs else f"epoch {epoch}"


def _vector(name: str, pinned: Pinned) -> dict[str, dict[str, int]]:
    """A job-state field holding a join's vector (none for one upstream)."""
    return {name: dict(pinned.epochs)} if pinned.epochs else {}
