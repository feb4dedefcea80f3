"""Per-partition status of a source backfill: state, offsets and backfilled fraction (no Spark)."""

from __future__ import annotations

from dataclasses import dataclass

from airflow_backfill.kafka.config import KafkaBackfillJob
from airflow_backfill.kafka.offsets import PartitionRange, topic_ranges
from airflow_backfill.kafka.positions import backfill_position, source_position
from airflow_backfill.kafka.split_state import BACKFILLING, FINISHED, NO_OFFSET, SplitState, backfilling


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


def split_statuses(job: KafkaBackfillJob, ranges: dict[int, PartitionRange] | None = None) -> list[SplitStatus]:
    """One line per partition of the topic (partitions the backfill has not seen yet are Backfilling(None))."""
    if ranges is None:
        ranges = topic_ranges(job.upstream.bootstrap_servers, job.upstream.topic)
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
    lines = [
        f"job {job.name}: topic {job.upstream.topic}, {finished}/{len(statuses)} partitions Finished, "
        f"MV round {position.round}, source version {position.source_version}",
        f"{'partition':>9}  {'state':<24}{'source committed':>17}{'kafka end':>11}{'backfilled':>12}",
    ]
    for s in statuses:
        lines.append(
            f"{s.partition:>9}  {str(s.state):<24}{_offset(s.source_committed):>17}{s.kafka_end:>11}"
            f"{s.backfilled_fraction:>11.1%}"
        )
    return "\n".join(lines)
