"""Live control of a running job: backfill parallelism, rate limit and round bounds.

`airflow-backfill alter` writes `<target>/_airflow_backfill/control.json`; the phases
read it at every snapshot chunk and catch-up round (the next safe point), so a change
applies without restarting the DAG. `--reset` removes the overrides and the job's own
values apply again. Forward runs at the job's `parallelism` and is not paced, so the
overrides only matter to the backfill (snapshot and catch-up). See docs/live-control.md.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_backfill.engine import job_state
from airflow_backfill.engine.job_state import state_dir
from airflow_backfill.exceptions import BackfillConfigError
from airflow_backfill.job import validate_parallelism, validate_rate_limit, validate_round_bound

if TYPE_CHECKING:
    from airflow_backfill.job import BackfillJob

CONTROL_FILE = "control.json"
_KEYS = ("backfill_parallelism", "rate_limit", "max_round_epochs", "max_round_bytes")


@dataclass(frozen=True)
class BackfillSettings:
    """The values a snapshot chunk or catch-up round runs with."""

    backfill_parallelism: int
    rate_limit: int | None
    altered: bool
    max_round_epochs: int | None = None
    max_round_bytes: int | None = None


def control_path(target: str) -> str:
    return os.path.join(state_dir(target), CONTROL_FILE)


def _validate(overrides: dict[str, Any], origin: str) -> dict[str, Any]:
    unknown = sorted(set(overrides) - set(_KEYS))
    if unknown:
        raise BackfillConfigError(
            f"{origin}: unknown override(s) {', '.join(unknown)}; only {', '.join(_KEYS)} can be altered."
        )
    try:
        if "backfill_parallelism" in overrides:
            validate_parallelism("backfill_parallelism", overrides["backfill_parallelism"])
        if "rate_limit" in overrides:
            validate_rate_limit(overrides["rate_limit"])
        for bound in ("max_round_epochs", "max_round_bytes"):
            if bound in overrides:
                validate_round_bound(bound, overrides[bound])
    except BackfillConfigError as error:
        raise BackfillConfigError(f"{origin}: {error}") from None
    return overrides


def read_overrides(target: str) -> dict[str, Any]:
    """The validated overrides ({} when none); a damaged file is an error, never ignored."""
    path = control_path(target)
    try:
        with open(path) as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return {}
    except json.JSONDecodeError as error:
        raise BackfillConfigError(
            f"{path} is not valid JSON ({error}); run `airflow-backfill alter --job FILE --reset` "
            "to remove it, then alter again."
        ) from None
    if not isinstance(data, dict):
        raise BackfillConfigError(f"{path} must hold a JSON object; run `airflow-backfill alter --reset`.")
    return _validate({key: data[key] for key in _KEYS if key in data}, str(path))


def write_overrides(target: str, **overrides: Any) -> dict[str, Any]:
    """Validate and merge overrides into the control file (atomic replace)."""
    _validate(overrides, "alter")
    data = {**read_overrides(target), **overrides, "altered_at": time.time()}
    directory = state_dir(target)
    os.makedirs(directory, exist_ok=True)
    fd, tmp_path = tempfile.mkstemp(dir=directory, prefix=".control-", suffix=".json")
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle, indent=2, sort_keys=True)
    os.replace(tmp_path, control_path(target))
    return data


def reset_overrides(target: str) -> None:
    """Remove every override: the job's own values apply from the next safe point."""
    try:
        os.remove(control_path(target))
    except FileNotFoundError:
        pass


def effective_settings(job: BackfillJob, parallelism: int | None = None) -> BackfillSettings:
    """The job's values (or the phase's --parallelism), overridden by `alter`, if any."""
    overrides = read_overrides(job.target)
    return BackfillSettings(
        backfill_parallelism=overrides.get("backfill_parallelism", parallelism or job.backfill_parallelism),
        rate_limit=overrides.get("rate_limit", job.rate_limit),
        altered=bool(overrides),
        max_round_epochs=overrides.get("max_round_epochs", job.max_round_epochs),
        max_round_bytes=overrides.get("max_round_bytes", job.max_round_bytes),
    )


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
    from airflow_backfill.engine.delta.log import latest_version, read_watermark, table_exists
    from airflow_backfill.engine.phases.snapshot_progress import load_progress

    state = job_state.read_state(job.target)
    phase = state.get("phase")
    watermark = read_watermark(job.target, job.app_id)
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
        pending = latest_version(job.source) - watermark if table_exists(job.source) else None
        return SafePoint(phase, False, (
            f"applies at the next catch-up round of job {job.name} (currently in phase "
            f"{phase}, round {rounds + 1}, {'-' if pending is None else pending} pending epochs)"
        ))
    return SafePoint(phase, False, (
        f"applies when the catch-up of job {job.name} starts (the snapshot is committed at "
        f"epoch {watermark})"
    ))
