"""A folder of job files: every job it declares, the MVs that read other MVs, and the files
that could not be read.

Each `*.yaml` / `*.yml` file of the folder (not its subfolders) declares one job: a Delta
job (docs/jobs.md) or a Kafka pipeline (a file with `upstream`, `source_job` and
`backfill`, docs/kafka.md). Relative table paths in a job file resolve against the
folder, so the same files work whatever the working directory of the process that reads
them (the DAG processor, a task, the shared forward). A file that fails to load becomes a
`JobFileError` naming the file and the problem, and the others still load: one bad file
never hides the rest.

Plain data, no Airflow: the DAG factory (`folder_dags.py`) and the shared forward
(`engine/phases/forward_set.py` through `spark_jobs/forward_set.py`) both read it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from airflow_backfill.exceptions import BackfillConfigError
from airflow_backfill.job import BackfillJob, expand_variables, normalize_table_uri
from airflow_backfill.kafka.config import KafkaPipeline

JOB_FILE_SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True)
class FolderJob:
    """One job of the folder and the file that declares it."""

    path: str
    """The job file (absolute)."""
    job: BackfillJob | KafkaPipeline

    @property
    def name(self) -> str:
        """The MV's job name (a Kafka pipeline's backfill name)."""
        return self.job.backfill.name if isinstance(self.job, KafkaPipeline) else self.job.name

    @property
    def target(self) -> str:
        """The MV this job writes."""
        return self.job.backfill.target if isinstance(self.job, KafkaPipeline) else self.job.target

    @property
    def reads(self) -> tuple[str, ...]:
        """The Delta tables the MV reads (a Kafka pipeline's MV reads its source table)."""
        if isinstance(self.job, KafkaPipeline):
            return (self.job.source_job.table,)
        return tuple(upstream.table for upstream in self.job.upstreams)

    @property
    def is_kafka(self) -> bool:
        return isinstance(self.job, KafkaPipeline)


@dataclass(frozen=True)
class JobFileError:
    """A job file that could not be loaded, and why (the message names the field)."""

    path: str
    message: str


@dataclass(frozen=True)
class JobFolder:
    """Every job of a folder, in file-name order, and the files that failed."""

    folder: str
    jobs: tuple[FolderJob, ...]
    errors: tuple[JobFileError, ...]

    def job(self, name: str) -> FolderJob:
        for entry in self.jobs:
            if entry.name == name:
                return entry
        raise KeyError(name)

    def upstream_jobs(self, entry: FolderJob) -> list[FolderJob]:
        """The jobs of the folder whose MV `entry` reads (its MV-on-MV dependencies)."""
        by_target = {other.target: other for other in self.jobs}
        return [by_target[table] for table in entry.reads if table in by_target]


def load_job_folder(folder: str | os.PathLike[str]) -> JobFolder:
    """Load every job file of `folder`; a file that fails becomes a `JobFileError`.

    Beyond each file's own validation, two files may not declare the same job name or the
    same target, and MVs may not read each other in a cycle: the later file (in name
    order), or every file of the cycle, is reported instead.
    """
    root = Path(folder).expanduser().resolve()
    if not root.is_dir():
        raise BackfillConfigError(f"job folder {root} does not exist or is not a folder; check the path.")
    loaded: list[FolderJob] = []
    errors: list[JobFileError] = []
    for path in sorted(p for p in root.iterdir() if p.suffix in JOB_FILE_SUFFIXES and p.is_file()):
        try:
            entry = FolderJob(str(path), load_folder_job(path, root))
        except BackfillConfigError as error:
            errors.append(JobFileError(str(path), str(error)))
            continue
        clash = _clash(entry, loaded)
        if clash is not None:
            errors.append(JobFileError(str(path), clash))
            continue
        loaded.append(entry)
    jobs, cycle_errors = _without_cycles(loaded)
    return JobFolder(str(root), tuple(jobs), tuple(errors + cycle_errors))


def load_folder_job(path: Path, folder: Path) -> BackfillJob | KafkaPipeline:
    """One job file, its relative table paths resolved against `folder`."""
    origin = f"job file {path}"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        raise BackfillConfigError(f"{origin} is not valid YAML: {error}") from None
    except OSError as error:
        raise BackfillConfigError(f"{origin} cannot be read: {error}") from None
    if not isinstance(data, dict):
        raise BackfillConfigError(f"{origin}: expected a mapping of job fields, got {type(data).__name__}.")
    if is_kafka_mapping(data):
        return KafkaPipeline.from_mapping(_resolved_kafka(data, folder, origin), origin=origin)
    return BackfillJob.from_mapping(_resolved_delta(data, folder, origin), origin=origin)


def is_kafka_mapping(data: Mapping[str, Any]) -> bool:
    """A Kafka pipeline's file has `kind: kafka` or a `source_job` section."""
    return data.get("kind") == "kafka" or "source_job" in data


def resolve_table_path(value: Any, folder: Path, field: str, origin: str) -> Any:
    """A relative local table path as an absolute one under `folder`; URIs, absolute paths,
    `~` and `${VARS}` (expanded first) are left to the job's own validation."""
    if not isinstance(value, str) or not value.strip() or "://" in value:
        return value
    try:
        expanded = expand_variables(value.strip())
    except BackfillConfigError as error:
        raise BackfillConfigError(f"{origin}: {field}: {error}") from None
    if "://" in expanded or os.path.isabs(expanded):
        return value
    return normalize_table_uri(field, str(folder / expanded))


def _resolved_delta(data: dict[str, Any], folder: Path, origin: str) -> dict[str, Any]:
    data = dict(data)
    for field in ("source", "target"):
        if field in data:
            data[field] = resolve_table_path(data[field], folder, field, origin)
    sources = data.get("sources")
    if isinstance(sources, Mapping):
        data["sources"] = {
            name: ({**entry, "table": resolve_table_path(entry["table"], folder, f"sources.{name}.table", origin)}
                   if isinstance(entry, Mapping) and "table" in entry else entry)
            for name, entry in sources.items()
        }
    return data


def _resolved_kafka(data: dict[str, Any], folder: Path, origin: str) -> dict[str, Any]:
    data = dict(data)
    for section, field in (("source_job", "table"), ("backfill", "target")):
        part = data.get(section)
        if isinstance(part, Mapping) and field in part:
            data[section] = {**part, field: resolve_table_path(part[field], folder, f"{section}.{field}", origin)}
    return data


def _clash(entry: FolderJob, loaded: list[FolderJob]) -> str | None:
    for other in loaded:
        if other.name == entry.name:
            return (f"job file {entry.path}: name {entry.name!r} is already the name of the job in {other.path}; "
                    "job names are unique (they name the MV's watermark and its DAG).")
        if other.target == entry.target:
            return (f"job file {entry.path}: target {entry.target} is already the target of {other.path}; "
                    "each MV needs its own table.")
    return None


def _without_cycles(jobs: list[FolderJob]) -> tuple[list[FolderJob], list[JobFileError]]:
    """Drop the jobs whose MVs read each other in a cycle (none of them could be built first)."""
    by_target = {entry.target: entry for entry in jobs}
    state: dict[str, str] = {}
    in_cycle: set[str] = set()

    def visit(entry: FolderJob, path: list[FolderJob]) -> None:
        state[entry.name] = "visiting"
        for table in entry.reads:
            upstream = by_target.get(table)
            if upstream is None:
                continue
            if state.get(upstream.name) == "visiting":
                start = next(i for i, item in enumerate(path) if item.name == upstream.name)
                in_cycle.update(item.name for item in path[start:])
            elif upstream.name not in state:
                visit(upstream, [*path, upstream])
        state[entry.name] = "done"

    for entry in jobs:
        if entry.name not in state:
            visit(entry, [entry])
    if not in_cycle:
        return jobs, []
    names = ", ".join(sorted(in_cycle))
    errors = [JobFileError(entry.path, f"job file {entry.path}: the MVs of {names} read each other in a cycle "
                                       "(source/sources/target); none of them can be built first.")
              for entry in jobs if entry.name in in_cycle]
    return [entry for entry in jobs if entry.name not in in_cycle], errors
