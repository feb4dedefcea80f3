"""Accept a job the ways a DAG author has it at hand: an object, a mapping, or a YAML path."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from airflow_backfill.exceptions import BackfillConfigError
from airflow_backfill.job import BackfillJob, load_job


def as_job(job: BackfillJob | Mapping[str, Any] | str | os.PathLike[str]) -> BackfillJob:
    """A validated BackfillJob; errors name what was passed and how to fix it."""
    if isinstance(job, BackfillJob):
        return job
    if isinstance(job, Mapping):
        return BackfillJob.from_mapping(dict(job), origin="job mapping")
    if isinstance(job, str | os.PathLike):
        return load_job(job)
    raise BackfillConfigError(
        f"job must be a BackfillJob, a mapping of job fields or a YAML file path, got {type(job).__name__}."
    )
