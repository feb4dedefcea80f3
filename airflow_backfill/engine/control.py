"""Live control of a running job: backfill parallelism and rate limit overrides.

`airflow-backfill alter` writes `<target>/_airflow_backfill/control.json`; the phases
read it at every snapshot chunk and catch-up round (the next safe point), so a change
applies without restarting the DAG. `--reset` removes the overrides and the job's own
values apply again.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_backfill.engine.job_state import state_dir
from airflow_backfill.job import validate_parallelism, validate_rate_limit

if TYPE_CHECKING:
    from airflow_backfill.job import BackfillJob

CONTROL_FILE = "control.json"
_KEYS = ("backfill_parallelism", "rate_limit")


@dataclass(frozen=True)
class BackfillSettings:
    """The values a snapshot chunk or catch-up round runs with."""

    backfill_parallelism: int
    rate_limit: int | None
    altered: bool


def read_overrides(target: str) -> dict[str, Any]:
    try:
        with open(os.path.join(state_dir(target), CONTROL_FILE)) as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return {}
    return {key: data[key] for key in _KEYS if key in data}


def write_overrides(target: str, **overrides: Any) -> dict[str, Any]:
    """Validate and merge overrides into the control file (atomic replace)."""
    if "backfill_parallelism" in overrides:
        validate_parallelism("backfill_parallelism", overrides["backfill_parallelism"])
    if "rate_limit" in overrides:
        validate_rate_limit(overrides["rate_limit"])
    data = {**read_overrides(target), **overrides, "altered_at": time.time()}
    directory = state_dir(target)
    os.makedirs(directory, exist_ok=True)
    fd, tmp_path = tempfile.mkstemp(dir=directory, prefix=".control-", suffix=".json")
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle, indent=2, sort_keys=True)
    os.replace(tmp_path, os.path.join(directory, CONTROL_FILE))
    return data


def reset_overrides(target: str) -> None:
    try:
        os.remove(os.path.join(state_dir(target), CONTROL_FILE))
    except FileNotFoundError:
        pass


def effective_settings(job: BackfillJob, parallelism: int | None = None) -> BackfillSettings:
    """The job's values (or the phase's --parallelism), overridden by `alter`, if any."""
    overrides = read_overrides(job.target)
    return BackfillSettings(
        backfill_parallelism=overrides.get("backfill_parallelism", parallelism or job.backfill_parallelism),
        rate_limit=overrides.get("rate_limit", job.rate_limit),
        altered=bool(overrides),
    )
