"""`airflow-backfill check`: what the DAG processor would refuse of a job file, for a job
folder's CI.

A job file is loaded exactly as a DAG loads it (fields, paths, the query's constructs and
key), without Spark and without Airflow's database, so a bad job fails its pull request
instead of becoming a DAG import error. With `with_tables` the checks that need the
upstream are made too, read with delta-rs: the table exists, keeps its change feed, holds
the key columns, and a join's columns resolve.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from airflow_backfill.exceptions import BackfillError
from airflow_backfill.job import BackfillJob
from airflow_backfill.job_folder import load_folder_job, load_job_folder
from airflow_backfill.kafka.config import KafkaPipeline


@dataclass(frozen=True)
class JobCheck:
    """The verdict on one job file."""

    path: str
    problem: str | None = None
    """What is wrong, as the DAG's import error would say it; None when the job loads."""

    @property
    def line(self) -> str:
        """One line for the terminal: the file, then what is wrong or `ok`."""
        if self.problem is None:
            return f"{self.path}: ok"
        problem = " ".join(self.problem.split())
        for named in (f"job file {self.path}: ", f"job file {Path(self.path).resolve()}: "):
            problem = problem.removeprefix(named)
        return f"{self.path}: {problem}"


def check_job_files(paths: Iterable[str | os.PathLike[str]], *, with_tables: bool = False) -> list[JobCheck]:
    """Check job files named one by one (relative table paths read beside each file)."""
    checks = []
    for given in paths:
        path = Path(given)
        if not path.is_file():
            checks.append(JobCheck(str(path), f"job file {path} does not exist; check the path."))
            continue
        try:
            job = load_folder_job(path, path.resolve().parent)
            if with_tables:
                check_tables(job)
        except BackfillError as error:
            checks.append(JobCheck(str(path), str(error)))
        else:
            checks.append(JobCheck(str(path)))
    return checks


def check_job_folder(folder: str | os.PathLike[str], *, with_tables: bool = False) -> list[JobCheck]:
    """Check a folder as `backfill_dags` loads it: each file, and the folder's own rules
    (unique names and targets, no MVs reading each other in a cycle)."""
    loaded = load_job_folder(folder)
    checks = [JobCheck(error.path, error.message) for error in loaded.errors]
    built_here = {entry.target for entry in loaded.jobs}
    for entry in loaded.jobs:
        try:
            if with_tables:
                check_tables(entry.job, skip=built_here)
        except BackfillError as error:
            checks.append(JobCheck(entry.path, str(error)))
        else:
            checks.append(JobCheck(entry.path))
    return sorted(checks, key=lambda check: check.path)


def check_tables(job: BackfillJob | KafkaPipeline, *, skip: Collection[str] = ()) -> None:
    """The checks `pin_epoch` makes of the upstreams, with delta-rs; `skip`: tables another
    job of the folder creates (an MV over an MV is checked once that MV exists). A Kafka
    pipeline's topic is not reached: its broker may not be reachable from CI."""
    if isinstance(job, KafkaPipeline):
        return
    from airflow_backfill.engine.delta.log import check_upstream

    upstreams = [upstream for upstream in job.upstreams if upstream.table not in skip]
    for upstream in upstreams:
        check_upstream(upstream.table, key=upstream.primary_key)
    if job.is_join and len(upstreams) == len(job.upstreams):
        from airflow_backfill.engine.joins.rounds import join_plan

        join_plan(job)
