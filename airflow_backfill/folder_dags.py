"""A folder of job files as DAGs: one call in a DAG file builds them all.

    from airflow_backfill.folder_dags import backfill_dags

    backfill_dags("jobs/")          # relative to this DAG file

Each job file becomes the DAG `<prefix><job name>` holding that job's backfill (the task
group of `task_group.py`, or of `kafka_task_group.py` for a Kafka pipeline). A job whose
`source`/`sources` is another job's MV is scheduled on that MV's `caught_up_asset`: its
backfill starts once the MV it reads is built (every MV it reads, for a join of MVs). The
others run once when their DAG is unpaused (`schedule`), and again when triggered.

With `forward="shared"` (the default) one more DAG, `<prefix>shared_forward`, runs one
Spark application that keeps every MV of the folder fresh (`shared_forward/`), and with
`backfill="folder"` (the default then) builds them too: each MV not created yet is
snapshotted and caught up in that application, an MV over an MV after its source, a join
after all its upstreams, `backfill_workers` at once, then kept fresh; a job file added
later is built the same way. Each job's DAG then only follows its MV: `wait_caught_up ─>
ready`. `backfill="per_job"` keeps each job's own backfill tasks (`pin_epoch ─> snapshot
─> catch_up ─> wait_caught_up ─> ready`, a `spark-submit` per phase). `forward="task"`
keeps the single-MV shape: each job's DAG backfills its MV and ends with its own
`forward` task.

Every MV asset of the folder's DAGs (`mv_asset`) carries the MV's watcher, so a DAG
scheduled on `mv_asset(job)` anywhere runs after the shared forward's commits too, not
only after the backfill's tasks.

A job file that fails to load does not hide the others: their DAGs are built, and the
file becomes an import error of its own (Airflow's "DAG Import Errors" list, under the
job file's path), naming the field (`JobFileErrorDag`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import DAG, Asset, AssetAll

from airflow_backfill.exceptions import BackfillConfigError
from airflow_backfill.folder_task_group import WAIT_OPTIONS, waiting_task_group
from airflow_backfill.job import BackfillJob, validate_whole_number
from airflow_backfill.job_folder import FolderJob, JobFileError, JobFolder, load_job_folder
from airflow_backfill.job_input import beside_caller
from airflow_backfill.kafka.config import KafkaPipeline
from airflow_backfill.kafka_task_group import kafka_backfill_task_group
from airflow_backfill.operators.shared_forward import SharedForwardOperator
from airflow_backfill.shared_forward import DEFAULT_BACKFILL_WORKERS, DEFAULT_WORKERS
from airflow_backfill.task_group import (
    backfill_task_group,
    caught_up_asset,
    delta_table_asset,
    mv_asset,
    share_watchers,
)

FORWARD_SHARED = "shared"
FORWARD_TASK = "task"
BACKFILL_FOLDER = "folder"
BACKFILL_PER_JOB = "per_job"
SHARED_FORWARD_DAG = "shared_forward"
DEFAULT_START = pendulum.datetime(2026, 1, 1, tz="UTC")
SHARED_FORWARD_RETRIES = 1000
"""The shared forward runs for as long as the folder lives: a driver that died (the
machine restarted, the JVM ran out of memory) is started again 30 s later, many times."""


class JobFileErrorDag(DAG):
    """Stands for one job file that failed to load, so that the DAG processor records the
    error as an import error *of that job file* and keeps the folder's other DAGs.

    Airflow marks every DAG of a file that has an import error as stale, so the error
    must not belong to the DAG file. A DAG that fails to serialize is reported under its
    own `relative_fileloc`: this one reports the job file's path (relative to the DAG
    bundle, as Airflow's import errors are) and fails to serialize with the error. The
    DAG processor clears import errors of files it does not list as DAG files when it
    refreshes the bundle, and records it again at the next parse of the DAG file: a job
    file that was fixed drops off the list at the latest at the next bundle refresh.
    """

    job_file: str = ""
    job_file_error: str = "a job file failed to load"
    _dag_file_relative: str | None = None

    @property  # type: ignore[override]
    def relative_fileloc(self) -> str | None:
        fileloc, dag_file = getattr(self, "fileloc", None), self._dag_file_relative
        if not fileloc or not dag_file or not fileloc.endswith(dag_file):
            return dag_file
        bundle = fileloc[: -len(dag_file)] or os.sep
        return os.path.relpath(self.job_file, bundle)

    @relative_fileloc.setter
    def relative_fileloc(self, value: str | None) -> None:
        self._dag_file_relative = value

    @property  # type: ignore[override]
    def edge_info(self) -> dict[str, Any]:
        """Read when the DAG is serialized, never before: the error surfaces there."""
        raise BackfillConfigError(self.job_file_error)

    @edge_info.setter
    def edge_info(self, value: dict[str, Any]) -> None:
        """Airflow's constructor sets it; this DAG has no edges."""


def backfill_dags(
    folder: str | os.PathLike[str],
    *,
    forward: str = FORWARD_SHARED,
    backfill: str | None = None,
    backfill_workers: int = DEFAULT_BACKFILL_WORKERS,
    dag_id_prefix: str = "",
    schedule: Any = "@once",
    start_date: datetime = DEFAULT_START,
    tags: Sequence[str] = ("airflow_backfill",),
    conn_id: str = "spark_default",
    forward_parallelism: int = 2,
    forward_workers: int = DEFAULT_WORKERS,
    forward_kwargs: Mapping[str, Any] | None = None,
    default_args: Mapping[str, Any] | None = None,
    **group_kwargs: Any,
) -> dict[str, DAG]:
    """Build the DAGs of every job file of `folder` (call it at a DAG file's top level).

    :param folder: the folder of job files; a relative path is relative to the calling
        DAG file (not the DAG processor's working directory).
    :param forward: `shared` (one application keeps every MV fresh) or `task` (each DAG
        ends with its own forward task).
    :param backfill: `folder` (the default with the shared forward: its application builds
        the MVs not created yet, and each job's DAG waits for its MV) or `per_job` (each
        job's DAG runs its own snapshot and catch-up tasks; the default with
        `forward="task"`).
    :param backfill_workers: MVs the shared forward builds at once with `backfill="folder"`.
    :param dag_id_prefix: put before each job's name to make its DAG id.
    :param schedule: schedule of the jobs that read no other job's MV (default: once,
        when the DAG is unpaused); jobs over MVs run on those MVs' caught-up assets.
    :param forward_parallelism, forward_workers: the shared forward's Spark parallelism
        and the rounds it applies at once.
    :param forward_kwargs: more `SharedForwardOperator` arguments (`status_file`, ...).
    :param default_args: the backfill DAGs' `default_args`, e.g. `{"retries": 2}` (every
        phase is safe to retry: a rerun resumes from what was committed).
    :param group_kwargs: passed to every Delta job's `backfill_task_group` (`verify`,
        `sensor_timeout`, `spark_conf`, ...).
    :return: the DAGs by id.
    """
    if forward not in (FORWARD_SHARED, FORWARD_TASK):
        raise BackfillConfigError(f"forward must be {FORWARD_SHARED!r} or {FORWARD_TASK!r}, got {forward!r}.")
    backfill = folder_backfill_shape(forward, backfill)
    validate_whole_number("backfill_workers", backfill_workers, 64)
    root = beside_caller(os.path.expandvars(os.fspath(folder))).resolve()
    loaded = load_job_folder(root)
    dags: dict[str, DAG] = {}
    for entry in loaded.jobs:
        dag_id = f"{dag_id_prefix}{entry.name}"
        with DAG(dag_id=dag_id, schedule=job_schedule(loaded, entry, schedule), start_date=start_date,
                 catchup=False, max_active_runs=1, tags=[*tags, "job_folder"], default_args=dict(default_args or {}),
                 doc_md=f"The backfill of `{entry.name}`, declared in `{entry.path}`.") as dag:
            _job_group(entry, forward=forward, backfill=backfill, conn_id=conn_id, **group_kwargs)
        dags[dag_id] = dag
    if forward == FORWARD_SHARED and loaded.jobs:
        dag_id = f"{dag_id_prefix}{SHARED_FORWARD_DAG}"
        with DAG(dag_id=dag_id, schedule="@once", start_date=start_date, catchup=False, max_active_runs=1,
                 tags=[*tags, "job_folder"],
                 doc_md=f"Keeps every MV of `{loaded.folder}` fresh in one Spark application.") as dag:
            SharedForwardOperator(task_id="forward", folder=loaded.folder, parallelism=forward_parallelism,
                                  workers=forward_workers, conn_id=conn_id, retries=SHARED_FORWARD_RETRIES,
                                  retry_delay=timedelta(seconds=30), backfill=backfill == BACKFILL_FOLDER,
                                  backfill_workers=backfill_workers, **dict(forward_kwargs or {}))
        dags[dag_id] = dag
    # A job over another job's MV names that MV as an inlet: the same watcher everywhere.
    share_watchers(task for dag in dags.values() for task in dag.tasks)
    for error in loaded.errors:
        _report_error(error, dag_id_prefix, start_date)
    return dags


def folder_backfill_shape(forward: str, backfill: str | None) -> str:
    """`backfill` checked against `forward`: the folder's backfill runs in the shared
    forward's application, so it needs one."""
    if backfill is None:
        return BACKFILL_FOLDER if forward == FORWARD_SHARED else BACKFILL_PER_JOB
    if backfill not in (BACKFILL_FOLDER, BACKFILL_PER_JOB):
        raise BackfillConfigError(f"backfill must be {BACKFILL_FOLDER!r} or {BACKFILL_PER_JOB!r}, got {backfill!r}.")
    if backfill == BACKFILL_FOLDER and forward != FORWARD_SHARED:
        raise BackfillConfigError(
            f"backfill={BACKFILL_FOLDER!r} runs in the shared forward's application, which forward={forward!r} "
            f"does not start; use backfill={BACKFILL_PER_JOB!r} with forward={forward!r}, or forward="
            f"{FORWARD_SHARED!r}.")
    return backfill


def folder_mv_asset(folder: str | os.PathLike[str], name: str) -> Asset:
    """The Asset of the MV of job `name` in the job folder `folder` (relative: to the calling
    DAG file), its table paths resolved as `backfill_dags` resolves them (against the
    folder): what a DAG in another file schedules on to run after the MV's commits, the
    shared forward's included (it carries the MV's watcher, `mv_asset`)."""
    loaded = load_job_folder(beside_caller(os.path.expandvars(os.fspath(folder))).resolve())
    for entry in loaded.jobs:
        if entry.name == name and isinstance(entry.job, BackfillJob):
            return mv_asset(entry.job)
    names = ", ".join(entry.name for entry in loaded.jobs if not entry.is_kafka) or "none"
    raise BackfillConfigError(f"job folder {loaded.folder} has no Delta job named {name!r} (its Delta jobs: {names}); "
                              "check the name, or the job file's load error on Airflow's import errors list.")


def job_schedule(loaded: JobFolder, entry: FolderJob, default: Any) -> Any:
    """The caught-up assets of the folder's MVs that `entry` reads (all of them), else `default`."""
    upstreams = loaded.upstream_jobs(entry)
    if not upstreams:
        return default
    assets = [_caught_up(upstream) for upstream in upstreams]
    return assets[0] if len(assets) == 1 else AssetAll(*assets)


def _caught_up(entry: FolderJob) -> Asset:
    if isinstance(entry.job, KafkaPipeline):
        return kafka_caught_up_asset(entry.job)
    return caught_up_asset(entry.job)


def kafka_caught_up_asset(pipeline: KafkaPipeline) -> Asset:
    """A Kafka MV's caught-up asset: every split of its backfill is Finished."""
    uri = delta_table_asset(pipeline.backfill.target).uri
    return Asset(name=f"{uri}/_airflow_backfill/caught_up", uri=f"{uri}/_airflow_backfill/caught_up")


def _job_group(entry: FolderJob, *, forward: str, backfill: str, conn_id: str, **group_kwargs: Any) -> None:
    if isinstance(entry.job, KafkaPipeline):
        # Under the shared forward the source job is one of its members (it keeps ingesting
        # the topic); otherwise the DAG runs it as a task beside the backfill, until stopped.
        kafka_backfill_task_group(entry.job, conn_id=conn_id, with_source_job=forward == FORWARD_TASK,
                                  ready_outlets=[kafka_caught_up_asset(entry.job)])
        return
    if backfill == BACKFILL_FOLDER:
        waiting_task_group(entry.job, **{key: value for key, value in group_kwargs.items() if key in WAIT_OPTIONS})
        return
    backfill_task_group(entry.job, conn_id=conn_id, forward=forward == FORWARD_TASK, ready=True, **group_kwargs)


def _report_error(error: JobFileError, dag_id_prefix: str, start_date: datetime) -> None:
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", Path(error.path).stem)
    with JobFileErrorDag(dag_id=f"{dag_id_prefix}job_file_error.{stem}", schedule=None,
                         start_date=start_date) as dag:
        pass
    dag.job_file = error.path
    dag.job_file_error = error.message
