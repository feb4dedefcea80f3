"""One MV's backfill inside the shared forward: its snapshot, then its catch-up.

The same two calls a per-job DAG's phase tasks make in their own `spark-submit`s
(`run_snapshot`, `run_catch_up`), here in a backfill worker's session of the folder's
one Spark application. Each phase takes the MV's writer lock, pins its own epoch, commits
with the MV's own app transaction and resumes from what was committed (a snapshot's
finished chunks, a catch-up's last round), so a killed application loses at most the
chunk or round in flight and a rerun continues. Catch-up marks the MV `created` when it
hands over; the member's turns after that are forward rounds.

What one application saves is the fixed cost of a process per phase (a JVM, Delta's
first use: about 30 s per MV on 2 cores, docs/platform.md): every backfill after the
first runs in a warm JVM.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_backfill.engine import job_state
from airflow_backfill.exceptions import WriterBusyError
from airflow_backfill.shared_forward.locks import LockBusy

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_backfill.job import BackfillJob

log = logging.getLogger(__name__)

BACKFILLED_BY = "shared_forward"
"""`backfilled_by` in the MV's state file when the folder's application built it."""


@dataclass(frozen=True)
class Backfilled:
    """What one backfill did."""

    watermark: int
    converged: bool
    """Catch-up reached the lag threshold (False: it handed over on a stalled lag)."""
    seconds: float
    snapshot_skipped: bool
    """The MV already had a watermark (an earlier run's snapshot committed)."""


def backfill_mv(spark: SparkSession, job: BackfillJob) -> Backfilled:
    """Snapshot then catch up `job`'s MV, resuming what an earlier run committed.

    Raises `LockBusy` when another process holds the MV's writer lock (its work is left
    to it, and the member tries again later); any other error is the backfill's.
    """
    from airflow_backfill.engine.phases.catch_up import run_catch_up
    from airflow_backfill.engine.phases.snapshot import run_snapshot

    started = time.monotonic()
    log.info("backfill of %s: snapshot, then catch-up (backfill parallelism %s)", job.target,
             job.backfill_parallelism)
    try:
        snapshot = run_snapshot(spark, job)
        caught_up = run_catch_up(spark, job)
    except WriterBusyError as busy:
        raise LockBusy(str(busy)) from None
    seconds = time.monotonic() - started
    job_state.update_state(job.target, backfilled_by=BACKFILLED_BY, backfill_seconds=round(seconds, 3),
                           backfill_error=None, backfill_error_at=None)
    log.info("backfill of %s done in %.1f s: created at watermark %s%s", job.target, seconds, caught_up.watermark,
             "" if caught_up.converged else " (the lag stalled: its forward rounds go on from there)")
    return Backfilled(caught_up.watermark, caught_up.converged, seconds, snapshot.skipped)
