"""The backfill jobs the deployment's DAGs declare: the only jobs the UI can address.

A request names a job, never a path: the name is looked up here. The jobs come from
Airflow's metadata database, never from a DAG file: the DAG processor serializes every
DAG it parses, and the tasks that carry a job add its JSON to their serialized fields
(serialized_job.py). So the API server runs no DAG code, and a DAG file that is slow or
broken to import costs it nothing.

A refresh asks the database for the versions of the DAGs that are not stale (ids,
version numbers and hashes: one query of small columns) and decodes only the DAGs whose
latest version changed since the last refresh. Requests within `REFRESH_SECONDS` of a refresh reuse its result.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from airflow_backfill.exceptions import BackfillConfigError
from airflow_backfill.job import BackfillJob
from airflow_backfill.kafka.config import KafkaPipeline
from airflow_backfill.serialized_job import SERIALIZED_JOB_FIELD, SERIALIZED_PIPELINE_FIELD

log = logging.getLogger(__name__)

REFRESH_SECONDS = 5.0
"""How long one look at the metadata database answers requests."""


@dataclass(frozen=True)
class JobTask:
    """A task that carries a job: what the page links to."""

    dag_id: str
    task_id: str
    task_type: str


@dataclass(frozen=True)
class KnownJob:
    """A job and the DAGs that declare it (reading or altering it needs access to all of them)."""

    job: BackfillJob
    dag_ids: tuple[str, ...]
    tasks: tuple[JobTask, ...] = ()

    @property
    def name(self) -> str:
        return self.job.name


@dataclass(frozen=True)
class KnownPipeline:
    """A Kafka pipeline and the DAGs that declare it."""

    pipeline: KafkaPipeline
    dag_ids: tuple[str, ...]
    tasks: tuple[JobTask, ...] = ()

    @property
    def name(self) -> str:
        return self.pipeline.backfill.name


@functools.lru_cache(maxsize=4096)
def _job_from_json(text: str) -> BackfillJob:
    return BackfillJob.from_mapping(json.loads(text), origin="serialized job")


@functools.lru_cache(maxsize=4096)
def _pipeline_from_json(text: str) -> KafkaPipeline:
    return KafkaPipeline.from_mapping(json.loads(text), origin="serialized Kafka pipeline")


def pipelines_in_serialized_dag(dag_id: str, data: Mapping[str, Any]) -> list[tuple[KafkaPipeline, JobTask]]:
    """The Kafka pipelines the tasks of one serialized DAG carry."""
    found = []
    for entry in data.get("dag", {}).get("tasks", []):
        task = entry.get("__var", entry) if isinstance(entry, Mapping) else {}
        text = task.get(SERIALIZED_PIPELINE_FIELD)
        if not isinstance(text, str):
            continue
        try:
            pipeline = _pipeline_from_json(text)
        except (BackfillConfigError, ValueError) as error:
            log.warning("DAG %s task %s carries a Kafka pipeline the UI cannot read, left out: %s",
                        dag_id, task.get("task_id"), error)
            continue
        found.append((pipeline, JobTask(dag_id, str(task.get("task_id")), str(task.get("task_type")))))
    return found


def index_pipelines(declared: Iterable[tuple[KafkaPipeline, JobTask]]) -> dict[str, KnownPipeline]:
    """The declared Kafka pipelines by their MV's name (the first declaration of a name wins)."""
    found: dict[str, KafkaPipeline] = {}
    tasks: dict[str, list[JobTask]] = {}
    for pipeline, task in sorted(declared, key=lambda pair: (pair[1].dag_id, pair[1].task_id)):
        if found.setdefault(pipeline.backfill.name, pipeline) == pipeline:
            tasks.setdefault(pipeline.backfill.name, []).append(task)
    return {name: KnownPipeline(pipeline, tuple(sorted({t.dag_id for t in tasks[name]})), tuple(tasks[name]))
            for name, pipeline in sorted(found.items())}


def jobs_in_serialized_dag(dag_id: str, data: Mapping[str, Any]) -> list[tuple[BackfillJob, JobTask]]:
    """The jobs the tasks of one serialized DAG carry (`SerializedDagModel.data`)."""
    found = []
    for entry in data.get("dag", {}).get("tasks", []):
        task = entry.get("__var", entry) if isinstance(entry, Mapping) else {}
        text = task.get(SERIALIZED_JOB_FIELD)
        if not isinstance(text, str):
            continue
        try:
            job = _job_from_json(text)
        except (BackfillConfigError, ValueError) as error:
            log.warning("DAG %s task %s carries a job the UI cannot read, left out: %s",
                        dag_id, task.get("task_id"), error)
            continue
        found.append((job, JobTask(dag_id, str(task.get("task_id")), str(task.get("task_type")))))
    return found


def index_jobs(declared: Iterable[tuple[BackfillJob, JobTask]]) -> dict[str, KnownJob]:
    """Index the declared jobs by name, with every DAG and task that declares them.

    Two DAGs may declare the same job (for example a backfill DAG and a repair DAG):
    they are one entry. Two different jobs under one name would be ambiguous to address,
    so the later one (in DAG id order) is left out with a warning.
    """
    found: dict[str, BackfillJob] = {}
    tasks: dict[str, list[JobTask]] = {}
    for job, task in sorted(declared, key=lambda pair: (pair[1].dag_id, pair[1].task_id)):
        known = found.setdefault(job.name, job)
        if known != job:
            log.warning("DAG %s declares a job %s that differs from another DAG's job of that name; "
                        "the UI shows the first one", task.dag_id, job.name)
            continue
        tasks.setdefault(job.name, []).append(task)
    return {
        name: KnownJob(job, tuple(sorted({task.dag_id for task in tasks[name]})), tuple(tasks[name]))
        for name, job in sorted(found.items())
    }


class SerializedDags(Protocol):
    """Where the serialized DAGs are read from (the metadata database; a stand-in in tests)."""

    def versions(self) -> dict[str, str]:
        """dag_id -> a key that changes whenever the DAG's latest serialized form changes."""

    def load(self, dag_id: str) -> Mapping[str, Any] | None:
        """The latest serialized form of one DAG."""


class MetadataDatabase:
    """The serialized DAGs in Airflow's metadata database (DAGs that are not stale)."""

    def versions(self) -> dict[str, str]:
        from airflow.models.dag import DagModel
        from airflow.models.dag_version import DagVersion
        from airflow.models.serialized_dag import SerializedDagModel
        from airflow.utils.session import create_session

        with create_session() as session:
            rows = (
                session.query(DagVersion.dag_id, DagVersion.version_number, SerializedDagModel.dag_hash)
                .join(SerializedDagModel, SerializedDagModel.dag_version_id == DagVersion.id)
                .join(DagModel, DagModel.dag_id == DagVersion.dag_id)
                .filter(~DagModel.is_stale)
                .all()
            )
        # The latest version of each DAG; one that changes before it ever ran is updated in
        # place, which its hash tells.
        latest: dict[str, tuple[int, str]] = {}
        for dag_id, number, dag_hash in rows:
            if dag_id not in latest or number > latest[dag_id][0]:
                latest[dag_id] = (number, dag_hash)
        return {dag_id: f"{number}:{dag_hash}" for dag_id, (number, dag_hash) in latest.items()}

    def load(self, dag_id: str) -> Mapping[str, Any] | None:
        from airflow.models.serialized_dag import SerializedDagModel
        from airflow.utils.session import create_session

        with create_session() as session:
            row = session.scalar(SerializedDagModel.latest_item_select_object(dag_id))
            return None if row is None else row.data


class JobRegistry:
    """The known jobs, refreshed from the serialized DAGs at most every `ttl` seconds."""

    def __init__(self, dags: SerializedDags | None = None, ttl: float = REFRESH_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._dags = dags or MetadataDatabase()
        self._ttl = ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._per_dag: dict[str, tuple[str, list[tuple[BackfillJob, JobTask]],
                                       list[tuple[KafkaPipeline, JobTask]]]] = {}
        self._jobs: dict[str, KnownJob] | None = None
        self._pipelines: dict[str, KnownPipeline] = {}
        self._refreshed_at = 0.0

    def jobs(self) -> dict[str, KnownJob]:
        with self._lock:
            if self._jobs is None or self._clock() - self._refreshed_at >= self._ttl:
                self._jobs = self._refresh()
                self._refreshed_at = self._clock()
            return self._jobs

    def get(self, name: str) -> KnownJob | None:
        return self.jobs().get(name)

    def pipelines(self) -> dict[str, KnownPipeline]:
        """The Kafka pipelines, from the same refresh as `jobs()`."""
        self.jobs()
        with self._lock:
            return self._pipelines

    def _refresh(self) -> dict[str, KnownJob]:
        versions = self._dags.versions()
        per_dag = {}
        for dag_id, version in versions.items():
            cached = self._per_dag.get(dag_id)
            if cached is not None and cached[0] == version:
                per_dag[dag_id] = cached
                continue
            data = self._dags.load(dag_id)
            per_dag[dag_id] = (version, jobs_in_serialized_dag(dag_id, data) if data else [],
                               pipelines_in_serialized_dag(dag_id, data) if data else [])
        self._per_dag = per_dag
        self._pipelines = index_pipelines(pair for _, _, pairs in per_dag.values() for pair in pairs)
        return index_jobs(pair for _, pairs, _ in per_dag.values() for pair in pairs)
