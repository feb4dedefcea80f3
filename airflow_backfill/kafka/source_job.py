"""The source job: the shared reader that appends a topic to a Delta table, forward only.

Each round reads, per partition, the records after the committed offset (at most
`max_records_per_round`), and appends them with the new per-partition offsets in the
same commit, so the table's rows and its committed offsets never disagree.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from airflow_backfill.engine.delta.log import table_exists
from airflow_backfill.engine.faults import maybe_crash
from airflow_backfill.engine.writer_lock import writer_lock
from airflow_backfill.exceptions import TargetError, UpstreamError
from airflow_backfill.kafka.config import KafkaSourceJob
from airflow_backfill.kafka.connection import broker_settings
from airflow_backfill.kafka.delta_write import append_commit
from airflow_backfill.kafka.liveness import BACKFILL, BACKFILL_GRACE_S, SOURCE_JOB, beating, running
from airflow_backfill.kafka.offsets import topic_ranges
from airflow_backfill.kafka.positions import OFFSETS_FIELD, ROUND_FIELD, backfill_position, source_position
from airflow_backfill.kafka.records import decode_error, first_undecodable, read_records

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)
PHASE = "kafka_source"


@dataclass(frozen=True)
class SourceRound:
    """What one source job round committed (`records == 0` and `committed False`: nothing new)."""

    round: int
    offsets: dict[int, int]
    records: int
    committed: bool


def plan_source_reads(job: KafkaSourceJob) -> tuple[dict[int, tuple[int, int]], dict[int, int], int]:
    """Per-partition `[start, end)` ranges to read, the current offsets and the round number."""
    position = source_position(job.table)
    ranges = topic_ranges(broker_settings(job.upstream), job.upstream.topic)
    reads: dict[int, tuple[int, int]] = {}
    for partition, available in ranges.items():
        start = position.committed(partition) + 1
        if start < available.earliest:
            raise UpstreamError(
                f"partition {partition} of topic {job.upstream.topic!r} no longer holds offsets "
                f"{start}..{available.earliest - 1} (deleted by retention) that source job {job.name!r} has not "
                "ingested yet; raise the topic's retention, or start the source job on a new table."
            )
        end = min(available.end, start + job.max_records_per_round)
        if end > start:
            reads[partition] = (start, end)
    return reads, dict(position.offsets), position.round


def run_source_round(spark: SparkSession, job: KafkaSourceJob) -> SourceRound:
    """Ingest what arrived since the committed offsets, in one commit (no commit when nothing arrived)."""
    reads, offsets, round_number = plan_source_reads(job)
    if not reads and table_exists(job.table):
        return SourceRound(round_number, offsets, 0, committed=False)
    records = read_records(spark, job.upstream, reads, job.parallelism)
    new_offsets = {**offsets, **{partition: end - 1 for partition, (_, end) in reads.items()}}
    maybe_crash(PHASE, "before_commit")
    try:
        append_commit(
            records, job.table, job.app_id, round_number + 1,
            {OFFSETS_FIELD: {str(p): o for p, o in sorted(new_offsets.items())}, ROUND_FIELD: round_number + 1},
        )
    except Exception as error:
        if "from_json" in str(error) or "MALFORMED_RECORD" in str(error):
            bad = first_undecodable(spark, job.upstream, reads)
            if bad is not None:
                raise decode_error(job.upstream, bad) from None
        raise
    maybe_crash(PHASE, "after_commit")
    count = sum(end - start for start, end in reads.values())
    log.info("source job %s round %s: %s records, offsets %s", job.name, round_number + 1, count, new_offsets)
    return SourceRound(round_number + 1, new_offsets, count, committed=True)


@dataclass
class BesideBackfill:
    """The bound of a source job that runs beside one backfill (a task next to it, or the
    one its task starts): it ends once the backfill's splits are all Finished, or once no
    backfill of that MV has been running for `grace` seconds (the backfill ended some other
    way, or never started: `airflow dags test` runs one task at a time)."""

    target: str
    grace: float = BACKFILL_GRACE_S
    _absent_since: float | None = field(default=None, repr=False)

    def reached(self) -> str | None:
        """Why the source job may stop now, or None."""
        if backfill_position(self.target).finished:
            return f"every split of the backfill of {self.target} is Finished"
        if running(self.target, BACKFILL) is not None:
            self._absent_since = None
            return None
        now = time.monotonic()
        if self._absent_since is None:
            self._absent_since = now
        if now - self._absent_since >= self.grace:
            return f"no backfill of {self.target} has been running for {self.grace:.0f} s"
        return None


@contextmanager
def sole_source_job(
    job: KafkaSourceJob, should_stop: Callable[[], bool], poll_interval: float = 2.0,
) -> Iterator[bool]:
    """Hold the source table's writer lock (and keep its heartbeat) for the block; yields
    False when `should_stop` said so before the lock was free.

    Another source job of the table may be running (a task's, or one a backfill task
    started): this one then waits as a standby instead of failing, and takes over when
    the other stops. Two never ingest at once.
    """
    waiting_since: float | None = None
    with ExitStack() as stack:
        while True:
            try:
                stack.enter_context(writer_lock(job.table, job.name, PHASE))
                break
            except TargetError as error:
                if waiting_since is None:
                    waiting_since = time.monotonic()
                    log.info("source job %s waits as a standby: %s", job.name, error)
                if should_stop():
                    yield False
                    return
                time.sleep(poll_interval)
        if waiting_since is not None:
            log.info("source job %s takes over after %.0f s", job.name, time.monotonic() - waiting_since)
        stack.enter_context(beating(job.table, SOURCE_JOB))
        yield True


def run_source_job(
    spark: SparkSession,
    job: KafkaSourceJob,
    *,
    poll_interval: float = 1.0,
    max_rounds: int | None = None,
    idle_timeout: float | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    bound: BesideBackfill | None = None,
) -> int:
    """Run rounds until stopped, `max_rounds` commits, `idle_timeout` seconds without
    records, or `bound` reached (each checked between rounds, never inside one)."""
    commits = 0
    idle_since = time.monotonic()
    while not should_stop():
        if bound is not None and (reason := bound.reached()) is not None:
            log.info("source job %s stops: %s", job.name, reason)
            break
        result = run_source_round(spark, job)
        if result.records:
            commits += 1
            idle_since = time.monotonic()
        if max_rounds is not None and commits >= max_rounds:
            break
        if idle_timeout is not None and time.monotonic() - idle_since >= idle_timeout:
            log.info("source job %s idle for %.0fs: stopping", job.name, idle_timeout)
            break
        if not result.records:
            time.sleep(poll_interval)
    return commits
