"""Per-partition status of a source backfill: state, offsets and backfilled fraction (no Spark)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from airflow_backfill.kafka.config import KafkaBackfillJob
from airflow_backfill.kafka.connection import broker_settings
from airflow_backfill.kafka.liveness import SOURCE_JOB, Running, running
from airflow_backfill.kafka.offsets import PartitionRange, topic_ranges
from airflow_backfill.kafka.positions import SourcePosition, backfill_position, source_position
from airflow_backfill.kafka.split_state import (
    BACKFILLING,
    FINISHED,
    NO_OFFSET,
    SOURCE_CACHING_UP,
    SplitState,
    backfilling,
)


@dataclass(frozen=True)
class SplitStatus:
    partition: int
    state: SplitState
    source_committed: int
    kafka_earliest: int
    kafka_end: int

    @property
    def backfilled_fraction(self) -> float:
        """Share of the records the split must take before it can finish that the MV already holds."""
        if self.state.kind != BACKFILLING:
            return 1.0
        goal = max(self.source_committed, self.kafka_end - 1)
        total = goal - self.kafka_earliest + 1
        if total <= 0:
            return 1.0
        return max(0.0, min(1.0, (self.state.offset - self.kafka_earliest + 1) / total))

    @property
    def waiting(self) -> str | None:
        """What a SourceCachingUp split waits for, and since when (None for other states)."""
        return waiting_split(self.partition, self.state, self.source_committed)


def clock(seconds: float | None) -> str:
    """A wall-clock time for people (UTC), or '?' when unknown."""
    if seconds is None:
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))


def waiting_split(partition: int, state: SplitState, committed: int) -> str | None:
    if state.kind != SOURCE_CACHING_UP:
        return None
    return (f"split {partition} waits for the source job to commit offset {state.offset} "
            f"(it has {_offset(committed)}) since {clock(state.since)}")


def waiting_report(splits: dict[int, SplitState], source: SourcePosition, source_job: Running | None) -> str | None:
    """One line on the splits waiting in SourceCachingUp and on the source job they wait
    for (None when no split waits): what the backfill logs and `kafka-status` shows."""
    waits = [w for p, s in sorted(splits.items()) if (w := waiting_split(p, s, source.committed(p)))]
    if not waits:
        return None
    if source_job is None:
        who = ("no source job is running, so nothing moves them: start the source job (the task group's "
               "source_job task, or spark_jobs/kafka_source.py)")
    else:
        who = f"the source job is running ({source_job.describe()}) and has not committed past them yet"
    return f"{'; '.join(waits)}; {who}"


def source_job_running(job: KafkaBackfillJob) -> Running | None:
    """The source job of `job`'s source table if it is running now (its heartbeat)."""
    return running(job.source_table, SOURCE_JOB)


def split_statuses(job: KafkaBackfillJob, ranges: dict[int, PartitionRange] | None = None) -> list[SplitStatus]:
    """One line per partition of the topic (partitions the backfill has not seen yet are Backfilling(None))."""
    if ranges is None:
        ranges = topic_ranges(broker_settings(job.upstream), job.upstream.topic)
    position = backfill_position(job.target)
    source = source_position(job.source_table)
    partitions = sorted(set(ranges) | set(position.splits))
    return [
        SplitStatus(
            partition=p,
            state=position.splits.get(p, backfilling()),
            source_committed=source.committed(p),
            kafka_earliest=ranges.get(p, PartitionRange(0, 0)).earliest,
            kafka_end=ranges.get(p, PartitionRange(0, 0)).end,
        )
        for p in partitions
    ]


def unfinished_splits(job: KafkaBackfillJob) -> tuple[int, dict[int, str]]:
    """(partitions of the topic, the ones not Finished yet with their states): what the
    sensor and its trigger wait on. A topic that grew counts its new partitions."""
    statuses = split_statuses(job)
    waiting = {s.partition: str(s.state) for s in statuses if s.state.kind != FINISHED}
    return len(statuses), waiting


def _offset(value: int) -> str:
    return "None" if value == NO_OFFSET else str(value)


def format_status(job: KafkaBackfillJob, statuses: list[SplitStatus]) -> str:
    """A table for the terminal, with a summary line first."""
    finished = sum(1 for s in statuses if s.state.kind == FINISHED)
    position = backfill_position(job.target)
    source_job = source_job_running(job)
    lines = [
        f"job {job.name}: topic {job.upstream.topic}, {finished}/{len(statuses)} partitions Finished, "
        f"MV round {position.round}, source version {position.source_version}",
        f"source job: {'running, ' + source_job.describe() if source_job else 'not running'}",
        f"{'partition':>9}  {'state':<24}{'source committed':>17}{'kafka end':>11}{'backfilled':>12}  since",
    ]
    for s in statuses:
        lines.append(
            f"{s.partition:>9}  {str(s.state):<24}{_offset(s.source_committed):>17}{s.kafka_end:>11}"
            f"{s.backfilled_fraction:>11.1%}  {clock(s.state.since)}"
        )
    report = waiting_report({s.partition: s.state for s in statuses},
                            SourcePosition(offsets={s.partition: s.source_committed for s in statuses}), source_job)
    if report:
        lines.append(f"waiting: {report}")
    return "\n".join(lines)
