"""Phase 2, log-store catch-up: replay the upstream's change feed in rounds.

Each round covers every epoch pending at its start, or as many as the round's bounds
allow (`max_round_epochs`, `max_round_bytes`), in one MV commit. Rounds repeat until the
lag is at or under the job's threshold; if the lag reaches no new low for
`max_stalled_rounds` rounds (the upstream writes faster than a round applies), catch-up
hands over to forward with a warning, which loses nothing because forward continues
from the same watermark.

Every round re-reads the live-control overrides (`airflow-backfill alter`), so a new
backfill parallelism, rate limit or round bound applies from the next round without a
restart.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from airflow_backfill.engine import job_state
from airflow_backfill.engine.control import BackfillSettings, effective_settings, wait_while_paused
from airflow_backfill.engine.downstream import register_downstream
from airflow_backfill.engine.feed_readers import record_feed_readers
from airflow_backfill.engine.parallelism import runtime_conf_for
from airflow_backfill.engine.phases.rounds import Rounds, rounds_for
from airflow_backfill.engine.rate_limit import pace
from airflow_backfill.engine.writer_lock import writer_lock

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_backfill.job import BackfillJob

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CatchUpRound:
    """What one round did; recorded in the state file for `status` and convergence checks."""

    round: int
    pending_epochs: int
    """Epochs pending when the round started (all of them are applied unless the round is bounded)."""
    seconds_behind: float
    """Age of the newest applied upstream epoch relative to the MV's watermark epoch."""
    change_rows: int
    seconds: float
    """Wall time of the round, pause for the rate limit included."""
    parallelism: int
    """Backfill parallelism the round ran at (the job's, or the `alter` override)."""
    rate_limit: int | None
    """Rows-per-second cap the round was paced to (None: unpaced)."""
    paused_seconds: float
    """Part of `seconds` spent waiting for the rate limit."""
    watermark: int
    """The epoch the round committed as the MV's watermark (a round may stop at the end of
    an append-only prefix of its range)."""
    plan: str = ""
    """How the round wrote its changes (append, replace, merge, overwrite, recompute; see
    docs/round-plans.md)."""


@dataclass(frozen=True)
class CatchUpResult:
    watermark: int
    rounds: list[CatchUpRound]
    pending_epochs: int
    converged: bool


def run_catch_up(spark: SparkSession, job: BackfillJob, *, parallelism: int | None = None) -> CatchUpResult:
    """Catch the MV up until pending epochs <= lag_threshold (or the lag stalls).

    `parallelism` (the task's --parallelism) replaces the job's backfill parallelism;
    an `alter` override replaces both, from the next round.
    """
    upstreams = rounds_for(job, warn=True)  # plans the query, checks the upstreams and the MV
    with writer_lock(job.target, job.name, job_state.PHASE_CATCH_UP):
        return _catch_up(spark, job, upstreams, parallelism)


def _catch_up(spark: SparkSession, job: BackfillJob, upstreams: Rounds, parallelism: int | None) -> CatchUpResult:
    record_feed_readers(spark, job)
    register_downstream(job)
    watermark = upstreams.watermark()
    settings = effective_settings(job, parallelism)
    job_state.update_state(job.target, phase=job_state.PHASE_CATCH_UP,
                           parallelism=settings.backfill_parallelism)
    rounds: list[CatchUpRound] = []
    stalled = 0
    lowest: int | None = None
    while True:
        latest = upstreams.latest()
        pending = latest - watermark
        log.info("catch-up: watermark %s, upstream %s, pending epochs %s (threshold %s)",
                 watermark, latest, pending, job.lag_threshold)
        if pending <= job.lag_threshold:
            converged = True
            break
        # Stalled: rounds since the lag last reached a new low. A lag that only hovers (the
        # upstream commits about as fast as a round applies) hands over instead of looping.
        if lowest is not None and pending >= lowest:
            stalled += 1
        else:
            stalled, lowest = 0, pending
        if stalled >= job.max_stalled_rounds:
            log.warning(
                "catch-up: the lag has not reached a new low for %s rounds (pending %s, max_stalled_rounds %s); the "
                "upstream commits faster than catch-up applies. Handing over to forward, which continues "
                "from watermark %s: nothing is lost.", stalled, pending, job.max_stalled_rounds, watermark,
            )
            converged = False
            break
        if len(rounds) >= job.max_catch_up_rounds:
            log.warning(
                "catch-up: max_catch_up_rounds (%s) reached with %s pending epochs. Handing over to "
                "forward, which continues from watermark %s: nothing is lost.",
                job.max_catch_up_rounds, pending, watermark,
            )
            converged = False
            break
        wait_while_paused(job)
        settings = _round_settings(spark, job, parallelism, settings, len(rounds) + 1)
        end = upstreams.round_end(watermark, latest, settings)
        rounds.append(_run_round(spark, upstreams, end, pending, settings, len(rounds) + 1))
        watermark = rounds[-1].watermark
        job_state.update_state(job.target, catch_up_rounds=[asdict(r) for r in rounds], watermark=watermark,
                               parallelism=settings.backfill_parallelism)
    job_state.update_state(
        job.target, phase=job_state.PHASE_CATCH_UP, state=job_state.STATE_CREATED,
        caught_up_epoch=watermark, catch_up_converged=converged, catch_up_pending_epochs=pending,
        catch_up_handover_version=latest, catch_up_rounds=[asdict(r) for r in rounds],
    )
    log.info("catch-up done: watermark %s after %s rounds, pending %s", watermark, len(rounds), pending)
    return CatchUpResult(watermark=watermark, rounds=rounds, pending_epochs=pending, converged=converged)


def _round_settings(
    spark: SparkSession, job: BackfillJob, parallelism: int | None, previous: BackfillSettings, number: int
) -> BackfillSettings:
    """Re-read the overrides (the round is the safe point) and set the session up for them."""
    settings = effective_settings(job, parallelism)
    if settings != previous:
        log.info("catch-up round %s: backfill parallelism %s -> %s, rate limit %s -> %s (altered)", number,
                 previous.backfill_parallelism, settings.backfill_parallelism,
                 previous.rate_limit, settings.rate_limit)
    for key, value in runtime_conf_for(settings.backfill_parallelism).items():
        spark.conf.set(key, value)
    return settings


def _run_round(
    spark: SparkSession, upstreams: Rounds, end: int, pending: int, settings: BackfillSettings, number: int,
) -> CatchUpRound:
    """Apply the epochs up to `end` in one commit, then pace the round to the rate limit."""
    started = time.monotonic()
    applied = upstreams.apply(spark, end, phase=job_state.PHASE_CATCH_UP, parallelism=settings.backfill_parallelism)
    change_rows = applied.change_rows if applied else 0
    reached = applied.end_version if applied else end
    paused = pace(change_rows, time.monotonic() - started, settings.rate_limit)
    return CatchUpRound(
        round=number, pending_epochs=pending, seconds_behind=upstreams.seconds_behind(reached),
        change_rows=change_rows, seconds=round(time.monotonic() - started, 3),
        parallelism=settings.backfill_parallelism, rate_limit=settings.rate_limit,
        paused_seconds=round(paused, 3), watermark=reached, plan=applied.plan if applied else "",
    )

