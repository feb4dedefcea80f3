"""Accept a job the ways a DAG author has it at hand: an object, a mapping, or a YAML path.

A relative path in a DAG file names a file beside that DAG file, not one in whatever
folder Airflow's DAG processor or worker happens to run from: `as_job("jobs/x.yaml")`
and `backfill_dags("jobs")` (`folder_dags.py`) resolve it against the folder of the file
that called them (the first caller outside this package and Airflow's own modules, as
Airflow finds a DAG's `fileloc`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from airflow_backfill.exceptions import BackfillConfigError
from airflow_backfill.job import BackfillJob, load_job

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _airflow_dirs() -> tuple[str, ...]:
    """The folders Airflow's core and task SDK are installed in. Not `airflow.__path__`:
    it extends itself over every `airflow` folder on `sys.path`, a project's own included."""
    try:
        import airflow
        import airflow.sdk
    except ImportError:
        return ()
    folders = {os.path.dirname(os.path.abspath(module.__file__ or "")) for module in (airflow, airflow.sdk)}
    return tuple(folder + os.sep for folder in folders)


def _internal(filename: str) -> bool:
    """Frames of this package, of Airflow (its operators' constructors wrap ours) and of
    Python's import machinery, which stand between a DAG file and `as_job`."""
    if filename.startswith("<"):
        return True
    path = os.path.abspath(filename)
    return path.startswith((_PACKAGE_DIR + os.sep, *_airflow_dirs()))


def caller_folder() -> Path | None:
    """The folder of the first file on the call stack outside this package and Airflow:
    the DAG file that named the job. None when there is none (an interactive session)."""
    frame = sys._getframe(1)
    while frame is not None:
        if not _internal(frame.f_code.co_filename):
            return Path(os.path.abspath(frame.f_code.co_filename)).parent
        frame = frame.f_back  # type: ignore[assignment]
    return None


def beside_caller(path: str | os.PathLike[str]) -> Path:
    """`path` as given when absolute (after `~`), else relative to the calling file's folder."""
    given = Path(path).expanduser()
    if given.is_absolute():
        return given
    folder = caller_folder()
    return given if folder is None else folder / given


def as_job(job: BackfillJob | Mapping[str, Any] | str | os.PathLike[str]) -> BackfillJob:
    """A validated BackfillJob; errors name what was passed and how to fix it. A relative
    YAML path is read beside the file that names it (the DAG file)."""
    if isinstance(job, BackfillJob):
        return job
    if isinstance(job, Mapping):
        return BackfillJob.from_mapping(dict(job), origin="job mapping")
    if isinstance(job, str | os.PathLike):
        return load_job(beside_caller(job))
    raise BackfillConfigError(
        f"job must be a BackfillJob, a mapping of job fields or a YAML file path, got {type(job).__name__}."
    )
