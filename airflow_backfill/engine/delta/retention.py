"""Warn before the upstream's retention can outrun a backfill.

Catch-up replays the change feed from the snapshot's epoch, so the upstream must keep
that epoch's log entries (`delta.logRetentionDuration`, default 30 days) and change
files (`delta.deletedFileRetentionDuration`, default 7 days; VACUUM deletes older
ones) until the MV has caught up. If they expire first, catch-up fails (see
delta/change_feed.py) and the backfill starts over, so the risk is flagged up front.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from datetime import timedelta

import pyarrow as pa
import pyarrow.compute as pc

from airflow_backfill.engine.delta.log import commit_timestamp, delta_table

log = logging.getLogger(__name__)

LOG_RETENTION = "delta.logRetentionDuration"
FILE_RETENTION = "delta.deletedFileRetentionDuration"
DEFAULT_LOG_RETENTION = timedelta(days=30)
DEFAULT_FILE_RETENTION = timedelta(days=7)
BYTES_PER_SECOND_PER_CORE = 16 * 1024 * 1024
"""Conservative snapshot throughput (Parquet in and out) used to estimate its duration."""
SAFETY_FACTOR = 4
"""Room for retries, catch-up and a slower cluster than estimated."""
MIN_EXPECTED = timedelta(hours=1)

_UNITS = {"second": "seconds", "minute": "minutes", "hour": "hours", "day": "days", "week": "weeks"}
_INTERVAL = re.compile(r"^\s*(?:interval\s+)?(\d+)\s*(second|minute|hour|day|week)s?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Retention:
    log: timedelta
    deleted_files: timedelta

    @property
    def shortest(self) -> timedelta:
        return min(self.log, self.deleted_files)


def parse_interval(text: str) -> timedelta | None:
    """Delta's `interval 7 days` style; None when it cannot be read (then no warning)."""
    match = _INTERVAL.match(text)
    if not match:
        return None
    return timedelta(**{_UNITS[match.group(2).lower()]: int(match.group(1))})


def upstream_retention(source: str) -> Retention:
    configuration = delta_table(source).metadata().configuration
    log_retention = parse_interval(configuration.get(LOG_RETENTION, "")) or DEFAULT_LOG_RETENTION
    file_retention = parse_interval(configuration.get(FILE_RETENTION, "")) or DEFAULT_FILE_RETENTION
    return Retention(log=log_retention, deleted_files=file_retention)


def expected_backfill_duration(source: str, parallelism: int) -> timedelta:
    """A deliberately pessimistic estimate from the upstream's size and the parallelism."""
    table = delta_table(source)
    sizes = pa.table(table.get_add_actions(flatten=True)).column("size_bytes")
    total_bytes = int(pc.sum(sizes).as_py() or 0)
    seconds = SAFETY_FACTOR * total_bytes / (BYTES_PER_SECOND_PER_CORE * parallelism)
    return max(MIN_EXPECTED, timedelta(seconds=seconds))


def retention_warnings(source: str, parallelism: int) -> list[str]:
    """Warnings (logged too) when the upstream may expire what the backfill will need."""
    retention = upstream_retention(source)
    expected = expected_backfill_duration(source, parallelism)
    warnings = []
    for name, value in ((LOG_RETENTION, retention.log), (FILE_RETENTION, retention.deleted_files)):
        if value < expected:
            warnings.append(
                f"upstream {source}: {name} is {value}, shorter than this backfill may take "
                f"(estimated up to {expected}). If the upstream is vacuumed or its log expires before "
                f"catch-up reaches the snapshot's epoch, the backfill must start over: raise {name} "
                "for the duration of the backfill."
            )
    for warning in warnings:
        log.warning(warning)
    return warnings


def margin_warnings(source: str, watermark: int, *, now: float | None = None) -> list[str]:
    """Warn when the changes after `watermark` are older than half the file retention."""
    table = delta_table(source)
    if table.version() <= watermark:
        return []
    committed_at = commit_timestamp(source, watermark + 1)
    if committed_at is None:
        return []
    age = timedelta(seconds=((now or time.time()) * 1000 - committed_at) / 1000)
    retention = upstream_retention(source)
    if age < retention.shortest / 2:
        return []
    warning = (
        f"upstream {source}: the oldest change the MV still needs (version {watermark + 1}) is {age} old, "
        f"past half of the upstream's retention ({retention.shortest}); catch up soon or raise the "
        "retention, or a VACUUM will force a new snapshot."
    )
    log.warning(warning)
    return [warning]
