"""The source backfill: a new MV over a topic the source job already ingests.

Each round moves every split (partition) one step along
`Backfilling -> SourceCachingUp -> Finished` (see split_state.py) and commits, in one MV
commit, the query over the records it took this round together with the new split
states: records read straight from Kafka for `Backfilling` splits, and the source
table's rows above a `Finished` split's offset (read as of one source version). The MV
therefore always equals the query over every record at or below its split offsets. An
aggregate's round folds the records into its per-group state first (kafka/aggregate.py),
with the same split states in both commits.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from airflow_backfill.engine import control
from airflow_backfill.engine.delta.log import table_exists
from airflow_backfill.engine.faults import maybe_crash
from airflow_backfill.engine.rate_limit import pace
from airflow_backfill.exceptions import UpstreamError
from airflow_backfill.kafka import split_state
from airflow_backfill.kafka.aggregate import commit_aggregate_round, recover_state_ahead
from airflow_backfill.kafka.config import START_EARLIEST_AVAILABLE, KafkaBackfillJob
from airflow_backfill.kafka.connection import broker_settings
from airflow_backfill.kafka.delta_write import append_commit
from airflow_backfill.kafka.liveness import SOURCE_JOB, running
from airflow_backfill.kafka.offsets import PartitionRange, topic_ranges
from airflow_backfill.kafka.positions import (
    ROUND_FIELD,
    SOURCE_VERSION_FIELD,
    SPLITS_FIELD,
    WATERMARK_FIELD,
    BackfillPosition,
    SourcePosition,
    backfill_position,
    source_position,
)
from airflow_backfill.kafka.query import aggregate_plan
from airflow_backfill.kafka.records import decode_error, first_undecodable, read_records
from airflow_backfill.kafka.split_state import BACKFILLING, FINISHED, SOURCE_CACHING_UP, SplitState
from airflow_backfill.kafka.status import waiting_report

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)
PHASE = "kafka_backfill"
WAIT_REPORT_S = 15.0
"""Splits waiting in SourceCachingUp longer than this are reported, and again at this interval."""
SOURCE_VIEW = "source"


@dataclass(frozen=True)
class RoundPlan:
    """What one round reads and the split states it commits."""

    kafka_reads: dict[int, tuple[int, int]]
    """`[start, end)` per Backfilling split, read from Kafka."""
    source_reads: dict[int, tuple[int, int]]
    """`(after, up_to]` per Finished split, read from the source table."""
    splits: dict[int, SplitState]
    source: SourcePosition

    def changes(self, before: dict[int, SplitState]) -> bool:
        return bool(self.kafka_reads or self.source_reads) or self.splits != before


@dataclass(frozen=True)
class BackfillRound:
    """The outcome of one round."""

    round: int
    splits: dict[int, SplitState]
    kafka_records: int
    committed: bool
    source: SourcePosition = field(default_factory=SourcePosition)
    """The source job's position the round planned with."""

    @property
    def finished(self) -> bool:
        return bool(self.splits) and all(state.kind == FINISHED for state in self.splits.values())


def _backfill_start(job: KafkaBackfillJob, partition: int, state: SplitState, available: PartitionRange) -> int:
    start = state.offset + 1
    if start >= available.earliest:
        return start
    if job.start == START_EARLIEST_AVAILABLE and state.offset == split_state.NO_OFFSET:
        log.warning("partition %s: starting at the earliest available offset %s", partition, available.earliest)
        return available.earliest
    raise UpstreamError(
        f"partition {partition} of topic {job.upstream.topic!r} no longer holds offsets "
        f"{start}..{available.earliest - 1} (deleted by retention), which backfill {job.name!r} needs. "
        f"Raise the topic's retention and restart from a new target, or set start: {START_EARLIEST_AVAILABLE} "
        "to build the MV from the oldest records Kafka still holds."
    )


def plan_round(
    job: KafkaBackfillJob,
    position: BackfillPosition,
    source: SourcePosition,
    ranges: dict[int, PartitionRange],
    budget: int,
) -> RoundPlan:
    """The next step of every split (pure: the inputs are positions and Kafka's ranges)."""
    splits = dict(position.splits)
    for partition in ranges:
        splits.setdefault(partition, split_state.backfilling())  # partitions added mid-backfill
    kafka_reads: dict[int, tuple[int, int]] = {}
    source_reads: dict[int, tuple[int, int]] = {}
    planned: dict[int, SplitState] = {}
    for partition, before in sorted(splits.items()):
        state = before
        committed = source.committed(partition)
        if state.kind == BACKFILLING:
            available = ranges.get(partition, PartitionRange(0, 0))
            start = _backfill_start(job, partition, state, available)
            end = min(available.end, start + budget)
            offset = state.offset
            if end > start:
                kafka_reads[partition] = (start, end)
                offset = end - 1
            state = split_state.after_backfill_read(offset, committed)
        else:
            state = split_state.after_source_commit(state, committed)
            if state.kind == FINISHED and committed > state.offset:
                source_reads[partition] = (state.offset, committed)
                state = SplitState(FINISHED, committed)
        planned[partition] = state.moved_from(before)
    return RoundPlan(kafka_reads, source_reads, planned, source)


def _source_rows(spark: SparkSession, job: KafkaBackfillJob, plan: RoundPlan) -> DataFrame | None:
    from pyspark.sql import functions as F

    if not plan.source_reads:
        return None
    condition = None
    for partition, (after, up_to) in plan.source_reads.items():
        term = (F.col("_partition") == partition) & (F.col("_offset") > after) & (F.col("_offset") <= up_to)
        condition = term if condition is None else condition | term
    assert condition is not None
    table = spark.read.format("delta").option("versionAsOf", plan.source.version).load(job.source_table)
    return table.where(condition)


def round_records(spark: SparkSession, job: KafkaBackfillJob, plan: RoundPlan, parallelism: int) -> DataFrame:
    """This round's records: Kafka reads of Backfilling splits plus source rows of Finished ones."""
    records = read_records(spark, job.upstream, plan.kafka_reads, parallelism)
    from_source = _source_rows(spark, job, plan)
    if from_source is not None:
        records = records.unionByName(from_source.select(*records.columns))
    return records


def mv_rows(spark: SparkSession, job: KafkaBackfillJob, plan: RoundPlan, parallelism: int) -> DataFrame:
    """The per-record query over this round's records."""
    round_records(spark, job, plan, parallelism).createOrReplaceTempView(SOURCE_VIEW)
    return spark.sql(job.query)


def commit_round(
    spark: SparkSession, job: KafkaBackfillJob, plan: RoundPlan, round_number: int, parallelism: int,
) -> None:
    """The round's MV commit (a per-record query), or its state and MV commits (an aggregate)."""
    metadata = commit_metadata_for(plan, round_number)
    if aggregate_plan(job.query) is None:
        rows = mv_rows(spark, job, plan, parallelism)
        maybe_crash(PHASE, "before_commit")
        append_commit(rows, job.target, job.app_id, round_number, metadata)
        return
    records = round_records(spark, job, plan, parallelism)
    maybe_crash(PHASE, "before_commit")
    commit_aggregate_round(spark, job, records, round_number, metadata)


def commit_metadata_for(plan: RoundPlan, round_number: int) -> dict[str, object]:
    finished = bool(plan.splits) and all(state.kind == FINISHED for state in plan.splits.values())
    return {
        SPLITS_FIELD: split_state.states_to_json(plan.splits),
        ROUND_FIELD: round_number,
        SOURCE_VERSION_FIELD: plan.source.version,
        WATERMARK_FIELD: plan.source.version if finished else None,
    }


def run_backfill_round(spark: SparkSession, job: KafkaBackfillJob) -> BackfillRound:
    """Plan, read and commit one round; a round with nothing to change commits nothing."""
    settings = control.effective_settings(job)  # type: ignore[arg-type]  # reads only .target and the two knobs
    spark.conf.set("spark.sql.shuffle.partitions", str(settings.backfill_parallelism))
    position = backfill_position(job.target)
    if aggregate_plan(job.query) is not None:
        position = recover_state_ahead(spark, job, position)
    source = source_position(job.source_table)
    ranges = topic_ranges(broker_settings(job.upstream), job.upstream.topic)
    plan = plan_round(job, position, source, ranges, job.max_records_per_round)
    if table_exists(job.target) and not plan.changes(position.splits):
        return BackfillRound(position.round, position.splits, 0, committed=False, source=source)
    started = time.monotonic()
    round_number = position.round + 1
    try:
        commit_round(spark, job, plan, round_number, settings.backfill_parallelism)
    except Exception as error:
        if "from_json" in str(error) or "MALFORMED_RECORD" in str(error):
            bad = first_undecodable(spark, job.upstream, plan.kafka_reads)
            if bad is not None:
                raise decode_error(job.upstream, bad) from None
        raise
    maybe_crash(PHASE, "after_commit")
    kafka_records = sum(end - start for start, end in plan.kafka_reads.values())
    log.info(
        "backfill %s round %s: %s Kafka records; splits %s",
        job.name, round_number, kafka_records, ", ".join(f"{p}={s}" for p, s in sorted(plan.splits.items())),
    )
    pace(kafka_records, time.monotonic() - started, settings.rate_limit)
    return BackfillRound(round_number, plan.splits, kafka_records, committed=True, source=source)


def run_backfill(
    spark: SparkSession,
    job: KafkaBackfillJob,
    *,
    poll_interval: float = 1.0,
    timeout: float | None = None,
    max_rounds: int | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    report_every: float = WAIT_REPORT_S,
) -> BackfillRound:
    """Rounds until every split is Finished (or `timeout` seconds / `max_rounds` rounds / a stop).

    Splits that wait in SourceCachingUp for longer than `report_every` seconds are
    reported in the log, with the offsets they wait for and whether a source job runs,
    every `report_every` seconds while they wait.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    rounds = 0
    reported_at = 0.0
    while True:
        result = run_backfill_round(spark, job)
        rounds += 1
        if result.finished or should_stop() or (max_rounds is not None and rounds >= max_rounds):
            return result
        waiting = [s.since or 0.0 for s in result.splits.values() if s.kind == SOURCE_CACHING_UP]
        if waiting and time.time() - min(waiting) >= report_every and time.monotonic() - reported_at >= report_every:
            report = waiting_report(result.splits, result.source, running(job.source_table, SOURCE_JOB))
            log.warning("backfill %s waits: %s", job.name, report)
            reported_at = time.monotonic()
        if deadline is not None and time.monotonic() >= deadline:
            report = waiting_report(result.splits, result.source, running(job.source_table, SOURCE_JOB))
            unfinished = {p: str(s) for p, s in result.splits.items() if s.kind != FINISHED}
            raise TimeoutError(
                f"backfill {job.name!r} not finished after {timeout:.0f}s; splits not Finished: {unfinished}"
                + (f"; {report}" if report else "")
            )
        if not result.committed or waiting:
            time.sleep(poll_interval)
