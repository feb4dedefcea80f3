"""The backfill jobs the deployment's DAGs declare: the only jobs the UI can address.

A request names a job, never a path: the name is looked up here, in the jobs that the
tasks of the DAGs in the DAG folder carry (the phase operators, `pin_epoch` and the
sensor all hold their `BackfillJob`). Parsing the DAG folder is slow, so the result is
kept for `CACHE_SECONDS`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from airflow_backfill.job import BackfillJob

log = logging.getLogger(__name__)

CACHE_SECONDS = 30.0
"""How long a parse of the DAG folder answers requests before the folder is parsed again."""


@dataclass(frozen=True)
class KnownJob:
    """A job and the DAGs that declare it (reading or altering it needs access to all of them)."""

    job: BackfillJob
    dag_ids: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.job.name


def jobs_of_dags(dags: Iterable[Any]) -> dict[str, KnownJob]:
    """Index the jobs carried by the DAGs' tasks by name.

    Two DAGs may declare the same job (for example a backfill DAG and a repair DAG):
    they are one entry. Two different jobs under one name would be ambiguous to address,
    so the later one is left out with a warning.
    """
    found: dict[str, BackfillJob] = {}
    dag_ids: dict[str, set[str]] = {}
    for dag in dags:
        for task in getattr(dag, "tasks", ()):
            job = getattr(task, "job", None)
            if not isinstance(job, BackfillJob):
                continue
            known = found.setdefault(job.name, job)
            if known != job:
                log.warning("DAG %s declares a job %s that differs from another DAG's job of that name; "
                            "the UI shows the first one", dag.dag_id, job.name)
                continue
            dag_ids.setdefault(job.name, set()).add(dag.dag_id)
    return {name: KnownJob(job, tuple(sorted(dag_ids[name]))) for name, job in sorted(found.items())}


def dags_in_folder(dag_folder: str | None = None) -> list[Any]:
    """The DAGs of the deployment's DAG folder, parsed the way the DAG processor does."""
    from airflow import settings
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=dag_folder or settings.DAGS_FOLDER, load_op_links=False)
    if bag.import_errors:
        log.warning("DAG files that failed to import are left out of the backfill jobs: %s",
                    ", ".join(sorted(bag.import_errors)))
    return list(bag.dags.values())


class JobRegistry:
    """The known jobs, re-read from the DAG folder at most every `ttl` seconds."""

    def __init__(self, load_dags: Callable[[], Iterable[Any]] = dags_in_folder, ttl: float = CACHE_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._load_dags = load_dags
        self._ttl = ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._jobs: dict[str, KnownJob] | None = None
        self._loaded_at = 0.0

    def jobs(self) -> dict[str, KnownJob]:
        with self._lock:
            if self._jobs is None or self._clock() - self._loaded_at >= self._ttl:
                self._jobs = jobs_of_dags(self._load_dags())
                self._loaded_at = self._clock()
            return self._jobs

    def get(self, name: str) -> KnownJob | None:
        return self.jobs().get(name)
