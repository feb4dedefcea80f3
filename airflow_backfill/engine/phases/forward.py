"""Phase 3, forward: apply each new upstream epoch as it is committed.

Runs at the normal parallelism for as long as the job lives. Every new batch of epochs
(all the epochs that arrived since the last commit) becomes one MV commit. A stop
request (SIGTERM, or the bounds used by tests and `airflow dags test`) is honoured
between commits, so a commit is never cut in half.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_backfill.engine import job_state
from airflow_backfill.engine.downstream import register_downstream
from airflow_backfill.engine.feed_readers import record_feed_readers
from airflow_backfill.engine.phases.rounds import Rounds, rounds_for
from airflow_backfill.engine.writer_lock import writer_lock

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_backfill.job import BackfillJob

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ForwardBounds:
    """When an otherwise endless forward phase stops by itself."""

    max_epochs: int | None = None
    """Stop once the watermark moved this many epochs past where forward started."""
    idle_timeout: float | None = None
    """Stop after this many seconds without a new upstream epoch."""


@dataclass(frozen=True)
class ForwardResult:
    start_watermark: int
    watermark: int
    commits: int
    stopped_by: str


def run_forward(
    spark: SparkSession,
    job: BackfillJob,
    *,
    parallelism: int | None = None,
    bounds: ForwardBounds = ForwardBounds(),
    stop: threading.Event | None = None,
) -> ForwardResult:
    """Poll the upstream and apply new epochs until stopped or a bound is reached."""
    parallelism = parallelism or job.parallelism
    stop = stop or threading.Event()
    upstreams = rounds_for(job)  # plans the query, checks the upstreams and the MV
    with writer_lock(job.target, job.name, job_state.PHASE_FORWARD):
        return _forward(spark, job, upstreams, parallelism, bounds, stop)


def _forward(
    spark: SparkSession, job: BackfillJob, upstreams: Rounds, parallelism: int,
    bounds: ForwardBounds, stop: threading.Event,
) -> ForwardResult:
    record_feed_readers(spark, job)
    register_downstream(job)
    start = watermark = upstreams.watermark()
    job_state.update_state(job.target, phase=job_state.PHASE_FORWARD, state=job_state.STATE_CREATED,
                           parallelism=parallelism)
    log.info("forward from watermark %s at parallelism %s (bounds %s)", start, parallelism, bounds)
    commits = 0
    last_progress = time.monotonic()
    while True:
        if stop.is_set():
            stopped_by = "stop request"
            break
        if bounds.max_epochs is not None and watermark - start >= bounds.max_epochs:
            stopped_by = "max_epochs"
            break
        latest = upstreams.latest()
        end = upstreams.forward_end(watermark, latest) if latest > watermark else watermark
        if end > watermark:
            applied = upstreams.apply(spark, end, phase=job_state.PHASE_FORWARD, parallelism=parallelism)
            watermark = applied.end_version if applied else end
            commits += 1
            last_progress = time.monotonic()
            job_state.update_state(job.target, watermark=watermark, forward_commits=commits)
            continue
        if bounds.idle_timeout is not None and time.monotonic() - last_progress >= bounds.idle_timeout:
            stopped_by = "idle_timeout"
            break
        stop.wait(job.poll_interval)
    log.info("forward stopped (%s) at watermark %s after %s commits", stopped_by, watermark, commits)
    return ForwardResult(start, watermark, commits, stopped_by)
