"""Validate the overrides a manual trigger passes in `dag_run.conf`.

`airflow dags trigger DAG --conf '{...}'` accepts any JSON; a typo or a wrong type must
fail the run in its first task, before any Spark work, with a message naming the key.

A DAG's conf is shared by everything in the DAG: its own params, and possibly several
backfill groups (an MV over another MV). So a group reads two places and nothing else:

- `{"<group id>": {...}}`: overrides for that group only; every key inside is checked;
- top-level keys named like an override (`backfill_parallelism`, ...): every group.

Group-scoped values win; other top-level keys belong to the DAG and are left alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_backfill.exceptions import BackfillConfigError
from airflow_backfill.job import (
    validate_lag_threshold,
    validate_parallelism,
    validate_rate_limit,
    validate_round_plan,
)

JOB_KEYS = ("backfill_parallelism", "parallelism", "rate_limit", "lag_threshold", "round_plan")
"""Overrides applied to the job for this run."""
FORWARD_KEYS = ("forward_max_epochs", "forward_idle_timeout")
"""Bounds of this run's forward phase."""
ALLOWED_KEYS = JOB_KEYS + FORWARD_KEYS


def group_overrides(conf: Mapping[str, Any] | None, group_key: str) -> dict[str, Any]:
    """The validated overrides of the backfill group `group_key` in a DAG run's conf."""
    if not conf:
        return {}
    if not isinstance(conf, Mapping):
        raise BackfillConfigError(f"dag_run.conf must be a JSON object, got {type(conf).__name__}.")
    checked = validate_overrides({key: value for key, value in conf.items() if key in ALLOWED_KEYS})
    scoped = conf.get(group_key)
    if scoped is None or group_key in ALLOWED_KEYS:
        return checked
    if not isinstance(scoped, Mapping):
        raise BackfillConfigError(
            f"dag_run.conf[{group_key!r}] holds the overrides of backfill group {group_key!r} and must be "
            f'a JSON object such as {{"backfill_parallelism": 4}}, got {type(scoped).__name__}.'
        )
    return {**checked, **validate_overrides(scoped, origin=f"dag_run.conf[{group_key!r}]")}


def validate_overrides(conf: Mapping[str, Any] | None, origin: str = "dag_run.conf") -> dict[str, Any]:
    """The validated overrides (unknown keys, wrong types and out-of-range values raise)."""
    if not conf:
        return {}
    if not isinstance(conf, Mapping):
        raise BackfillConfigError(f"{origin} must be a JSON object, got {type(conf).__name__}.")
    unknown = sorted(set(conf) - set(ALLOWED_KEYS))
    if unknown:
        raise BackfillConfigError(
            f"unknown key(s) in {origin}: {', '.join(unknown)}. "
            f"Allowed keys: {', '.join(ALLOWED_KEYS)}."
        )
    checked: dict[str, Any] = {}
    for key, value in conf.items():
        key_origin = f"{origin}[{key!r}]"
        if key in ("backfill_parallelism", "parallelism"):
            checked[key] = validate_parallelism(key_origin, value)
        elif key == "rate_limit":
            checked[key] = validate_rate_limit(value)
        elif key == "lag_threshold":
            checked[key] = validate_lag_threshold(value)
        elif key == "round_plan":
            checked[key] = validate_round_plan(value)
        elif key == "forward_max_epochs":
            checked[key] = _optional_positive_int(key_origin, value)
        else:
            checked[key] = _optional_positive_number(key_origin, value)
    return checked


def job_overrides(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The subset of validated overrides that replaces job fields."""
    return {key: value for key, value in overrides.items() if key in JOB_KEYS}


def _optional_positive_int(origin: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BackfillConfigError(f"{origin} must be a positive integer or null, got {value!r}.")
    return value


def _optional_positive_number(origin: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise BackfillConfigError(f"{origin} must be a positive number of seconds or null, got {value!r}.")
    return float(value)
