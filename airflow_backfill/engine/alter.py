"""`airflow-backfill alter` and the UI's alter: store live-control overrides and say
when the running phase picks them up (its next safe point).

Above the phases: telling where a job is reads the snapshot's progress and a join's
upstream versions, so it cannot live in `control`, which the phases themselves read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_backfill.engine import job_state
from airflow_backfill.engine.control import (
    BackfillSettings,
    effective_settings,
    reset_overrides,
    resume_overrides,
    write_overrides,
)
from airflow_backfill.exceptions import BackfillConfigError

if TYPE_CHECKING:
    from airflow_backfill.job import BackfillJob


@dataclass(frozen=True)
class AlterResult:
    """What an alter changed, and when the change reaches the running phase."""

    before: BackfillSettings | None
    """None when the control file was unreadable (a reset clears it)."""
    after: BackfillSettings
    safe_point: SafePoint


def apply_alter(job: BackfillJob, overrides: dict[str, Any], *, reset: bool = False,
                resume: bool = False) -> AlterResult:
    """Store `overrides`, remove them all (`reset`) or lift a pause (`resume`); the CLI and
    the UI both go through here.

    The values are validated before anything is written; a damaged control file is
    reported, except by a reset, which is the way out of it.
    """
    before: BackfillSettings | None = None
    try:
        before = effective_settings(job)
    except BackfillConfigError:
        if not reset:
            raise
    if reset:
        reset_overrides(job.target)
    elif resume:
        resume_overrides(job.target)
    else:
        write_overrides(job.target, **overrides)
    return AlterResult(before, effective_settings(job), next_safe_point(job))


@dataclass(frozen=True)
class SafePoint:
    """Where a job is, and when an override written now reaches it."""

    phase: str | None
    """The phase recorded in the job's state file (None before the first run)."""
    backfill_finished: bool
    """Catch-up is done: an override waits for a future backfill."""
    message: str
    """One sentence for people: when the change applies, and why."""


def next_safe_point(job: BackfillJob) -> SafePoint:
    """When an override applies: next snapshot chunk, next catch-up round, or later."""
    from airflow_backfill.engine.delta.log import read_watermark
    from airflow_backfill.engine.joins.watermarks import latest_epoch
    from airflow_backfill.engine.snapshot_chunks.progress import load_progress

    state = job_state.read_state(job.target)
    phase = state.get("phase")
    watermark = read_watermark(job.target, job.app_id)
    if state.get("paused_since") is not None:
        return SafePoint(phase, False, (
            f"job {job.name} is held at a safe point of phase {phase} by a rate limit of 0; it re-reads "
            f"the overrides every {job.poll_interval:g}s and continues with them once the rate limit is not 0"
        ))
    if state.get("state") == job_state.STATE_CREATED:
        return SafePoint(phase, True, (
            f"stored for a future backfill: job {job.name} has finished its backfill (phase {phase}, "
            f"watermark {watermark}); forward runs at parallelism {job.parallelism} without a rate "
            "limit, so nothing changes now"
        ))
    if watermark is None:
        progress = load_progress(job.target)
        if progress is None:
            return SafePoint(phase, False, (
                f"applies when the backfill of job {job.name} starts: the MV {job.target} "
                "does not exist yet"
            ))
        done = len(progress.done)
        if done < progress.chunks_total:
            return SafePoint(phase, False, (
                f"applies at the next snapshot chunk of job {job.name} (currently in phase "
                f"{job_state.PHASE_SNAPSHOT}, chunk {done + 1}/{progress.chunks_total})"
            ))
        return SafePoint(phase, False, (
            f"applies when the catch-up of job {job.name} starts (the snapshot has run all "
            f"{progress.chunks_total} chunks and is being committed)"
        ))
    if phase == job_state.PHASE_CATCH_UP:
        rounds = len(state.get("catch_up_rounds") or [])
        latest = latest_epoch(job)
        pending = None if latest is None else latest - watermark
        return SafePoint(phase, False, (
            f"applies at the next catch-up round of job {job.name} (currently in phase "
            f"{phase}, round {rounds + 1}, {'-' if pending is None else pending} pending epochs)"
        ))
    return SafePoint(phase, False, (
        f"applies when the catch-up of job {job.name} starts (the snapshot is committed at "
        f"epoch {watermark})"
    ))
