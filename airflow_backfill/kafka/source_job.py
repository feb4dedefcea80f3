"""The source job: the shared reader that appends a topic to a Delta table, forward only.

Each round reads, per partition, the records after the committed offset (at most
`max_records_per_round`), and appends them with the new per-partition offsets in the
same commit, so the table's rows and its committed offsets never disagree.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_backfill.engine.delta.log import table_exists
from airflow_backfill.engine.faults import maybe_crash
from airflow_backfill.exceptions import UpstreamError
from airflow_backfill.kafka.config import KafkaSourceJob
from airflow_backfill.kafka.delta_write import append_commit
from airflow_backfill.kafka.offsets import topic_ranges
from airflow_backfill.kafka.positions import OFFSETS_FIELD, ROUND_FIELD, source_position
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
    ranges = topic_ranges(job.upstream.bootstrap_servers, job.upstream.topic)
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


def run_source_job(
    spark: SparkSession,
    job: KafkaSourceJob,
    *,
    poll_interval: float = 1.0,
    max_rounds: int | None = None,
    idle_timeout: float | None = None,
    should_stop: Callable[[], bool] = lambda: False,
) -> int:
    """Run rounds until stopped, `max_rounds` commits, or `idle_timeout` seconds without records."""
    commits = 0
    idle_since = time.monotonic()
    while not should_stop():
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
