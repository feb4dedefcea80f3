"""Live control of a running job: backfill parallelism, rate limit and round bounds.

`airflow-backfill alter` writes `<target>/_airflow_backfill/control.json`; the phases
read it at every snapshot chunk and catch-up round (the next safe point), so a change
applies without restarting the DAG. `--reset` removes the overrides and the job's own
values apply again. Forward runs at the job's `parallelism` and is not paced, so the
overrides only matter to the backfill (snapshot and catch-up). See docs/live-control.md.

A rate limit of 0 pauses the backfill: the phase holds at its next safe point (before
the next chunk or round, with everything before it committed or recorded) until the
limit is altered or reset. Job files and `dag_run.conf` keep refusing 0, since a job
that starts paused is almost surely a typo; only `alter` can pause.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_backfill.engine import job_state
from airflow_backfill.engine.job_state import state_dir
from airflow_backfill.exceptions import BackfillConfigError
from airflow_backfill.job import validate_optional_cap, validate_parallelism, validate_rate_limit
from airflow_backfill.storage import files
from airflow_backfill.storage.uri import join

if TYPE_CHECKING:
    from airflow_backfill.job import BackfillJob

log = logging.getLogger(__name__)

CONTROL_FILE = "control.json"
_KEYS = ("backfill_parallelism", "rate_limit", "max_round_epochs", "max_round_bytes")

PAUSED_RATE_LIMIT = 0
"""The rate limit that holds snapshot and catch-up at their next safe point."""
PAUSE_MEMO = "rate_limit_before_pause"
"""Control-file key: the rate limit override a pause replaced ({} when there was none)."""


@dataclass(frozen=True)
class BackfillSettings:
    """The values a snapshot chunk or catch-up round runs with."""

    backfill_parallelism: int
    rate_limit: int | None
    altered: bool
    max_round_epochs: int | None = None
    max_round_bytes: int | None = None

    @property
    def paused(self) -> bool:
        """A rate limit of 0: the phase holds at its next safe point."""
        return self.rate_limit == PAUSED_RATE_LIMIT


def control_path(target: str) -> str:
    return join(state_dir(target), CONTROL_FILE)


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
            validate_override_rate_limit(overrides["rate_limit"])
        for bound in ("max_round_epochs", "max_round_bytes"):
            if bound in overrides:
                validate_optional_cap(bound, overrides[bound])
    except BackfillConfigError as error:
        raise BackfillConfigError(f"{origin}: {error}") from None
    return overrides


def validate_override_rate_limit(value: Any) -> int | None:
    """A rate limit an `alter` may set: the job's rates, None (no cap) or 0 (paused)."""
    if value == PAUSED_RATE_LIMIT and not isinstance(value, bool) and isinstance(value, int):
        return PAUSED_RATE_LIMIT
    return validate_rate_limit(value)


def _read_control(target: str) -> dict[str, Any]:
    """The control file's validated overrides and pause memo ({} when there is no file)."""
    path = control_path(target)
    text = files.read_text(path)
    if text is None:
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise BackfillConfigError(
            f"{path} is not valid JSON ({error}); run `airflow-backfill alter --job FILE --reset` "
            "to remove it, then alter again."
        ) from None
    if not isinstance(data, dict):
        raise BackfillConfigError(f"{path} must hold a JSON object; run `airflow-backfill alter --reset`.")
    control = _validate({key: data[key] for key in _KEYS if key in data}, str(path))
    memo = data.get(PAUSE_MEMO)
    if memo is not None:
        if not isinstance(memo, dict) or set(memo) - {"rate_limit"} or memo.get("rate_limit") == PAUSED_RATE_LIMIT:
            raise BackfillConfigError(f"{path}: {PAUSE_MEMO} must be {{}} or {{\"rate_limit\": N or null}}, got "
                                      f"{memo!r}; run `airflow-backfill alter --reset`.")
        _validate(dict(memo), str(path))
        control[PAUSE_MEMO] = memo
    return control


def read_overrides(target: str) -> dict[str, Any]:
    """The validated overrides ({} when none); a damaged file is an error, never ignored."""
    return {key: value for key, value in _read_control(target).items() if key in _KEYS}


def write_overrides(target: str, **overrides: Any) -> dict[str, Any]:
    """Validate and merge overrides into the control file (atomic replace).

    Pausing (a rate limit of 0) remembers the rate limit override it replaces, or that
    there was none, so that `resume_overrides` can bring it back; any other rate limit
    written later replaces that memory.
    """
    _validate(overrides, "alter")
    current = _read_control(target)
    data = {**current, **overrides}
    if "rate_limit" in overrides:
        data.pop(PAUSE_MEMO, None)
        if overrides["rate_limit"] == PAUSED_RATE_LIMIT:
            data[PAUSE_MEMO] = _memo_before_pause(current)
    _write_control(target, data)
    return data


def resume_overrides(target: str) -> None:
    """Lift a pause: the rate limit before it applies again (the earlier override, or the job's).

    Only a paused job can be resumed; anything else is refused, with nothing written.
    """
    current = _read_control(target)
    if current.get("rate_limit") != PAUSED_RATE_LIMIT:
        raise BackfillConfigError("the backfill is not paused, so there is nothing to resume; "
                                  "set a rate limit instead.")
    data = {key: value for key, value in current.items() if key not in ("rate_limit", PAUSE_MEMO)}
    data.update(current.get(PAUSE_MEMO) or {})
    if data:
        _write_control(target, data)
    else:
        reset_overrides(target)


def _memo_before_pause(control: dict[str, Any]) -> dict[str, Any]:
    """What a pause replaces: a pause over a pause keeps the first one's memory."""
    if PAUSE_MEMO in control:
        return control[PAUSE_MEMO]
    if "rate_limit" in control and control["rate_limit"] != PAUSED_RATE_LIMIT:
        return {"rate_limit": control["rate_limit"]}
    return {}


def _write_control(target: str, data: dict[str, Any]) -> None:
    files.write_text(control_path(target), json.dumps({**data, "altered_at": time.time()}, indent=2, sort_keys=True))


def reset_overrides(target: str) -> None:
    """Remove every override: the job's own values apply from the next safe point."""
    files.remove(control_path(target))


def effective_settings(job: BackfillJob, parallelism: int | None = None) -> BackfillSettings:
    """The job's values (or the phase's --parallelism), overridden by `alter`, if any.

    A Kafka source backfill has no round bounds of its own (it bounds rounds by records),
    hence the `getattr` defaults.
    """
    overrides = read_overrides(job.target)
    return BackfillSettings(
        backfill_parallelism=overrides.get("backfill_parallelism", parallelism or job.backfill_parallelism),
        rate_limit=overrides.get("rate_limit", job.rate_limit),
        altered=bool(overrides),
        max_round_epochs=overrides.get("max_round_epochs", getattr(job, "max_round_epochs", None)),
        max_round_bytes=overrides.get("max_round_bytes", getattr(job, "max_round_bytes", None)),
    )


def is_paused(target: str) -> bool:
    """True while an `alter --rate-limit 0` holds the job's backfill."""
    return read_overrides(target).get("rate_limit") == PAUSED_RATE_LIMIT


def wait_while_paused(
    job: BackfillJob,
    *,
    stop: threading.Event | None = None,
    poll_interval: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> float:
    """Hold here while the job's rate limit is 0; returns the seconds held.

    Called where a phase is at a safe point (before a snapshot chunk or a catch-up
    round), so holding loses nothing. The overrides are re-read every `poll_interval`
    seconds (the job's `poll_interval` by default); the wait ends when the limit is no
    longer 0 or when `stop` is set. The state file records `paused_since` meanwhile, so
    the status and the UI can say that the job is held rather than slow.
    """
    if not is_paused(job.target):
        return 0.0
    interval = job.poll_interval if poll_interval is None else poll_interval
    stop = stop or threading.Event()
    started = clock()
    log.info("job %s paused (rate limit 0): holding at the next safe point until the rate limit is "
             "altered or reset", job.name)
    job_state.update_state(job.target, paused_since=time.time())
    try:
        while is_paused(job.target):
            if stop.wait(interval):
                log.info("job %s: stop requested while paused", job.name)
                break
    finally:
        job_state.update_state(job.target, paused_since=None)
    held = clock() - started
    log.info("job %s resumed after %.1fs paused", job.name, held)
    return held
