"""Consistent reads across MVs, for people: name the tables the way they are at hand (job
objects, job files, Kafka pipelines, table URIs) and get one version of each, all
reflecting the same upstream epochs.

    from airflow_backfill.consistent_reads import consistent_versions
    from airflow_backfill.engine.consistency.readers import read_arrow

    answer = consistent_versions(["jobs/orders_mv.yaml", "jobs/revenue_by_customer.yaml"])
    revenue = read_arrow(answer, "revenue_by_customer")

The engine (`airflow_backfill.engine.consistency`) does the work from the Delta logs; this
module only turns what it is given into the engine's table specs. See docs/consistent-reads.md.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from airflow_backfill.engine.consistency.answer import DEFAULT_HISTORY, POLICY_COMMON, ConsistentVersions
from airflow_backfill.engine.consistency.tables import TableSpec, spec_for_job, spec_for_table
from airflow_backfill.exceptions import BackfillConfigError
from airflow_backfill.job import BackfillJob, normalize_table_uri
from airflow_backfill.job_folder import JOB_FILE_SUFFIXES, is_kafka_mapping, load_folder_job
from airflow_backfill.kafka.config import KafkaBackfillJob, KafkaPipeline
from airflow_backfill.kafka.consistency import spec_for_kafka_job

Readable = BackfillJob | KafkaBackfillJob | KafkaPipeline | TableSpec | Mapping[str, Any] | str | os.PathLike[str]
"""A table to read: a job (object, mapping of its fields, or YAML file), a Kafka pipeline
or its backfill job, a table URI, or a spec."""


def consistent_versions(
    tables: Sequence[Readable], *, also: Sequence[Readable] = (), policy: str = POLICY_COMMON, at: Any = None,
    history: int = DEFAULT_HISTORY,
) -> ConsistentVersions:
    """One version of each table, all reflecting the same upstream epochs.

    :param tables: the tables to read, named explicitly: read even while being created.
    :param also: more tables, named as part of a set (e.g. every job of a folder): left
        out while their job is still creating them, so that they hold nobody back.
    :param policy: `common` (the newest epochs all have committed), `latest` (each
        table's newest version) or `at` (the versions at the epochs `at` gives).
    :param at: with `at`: a version of the one upstream table, or `{table: version}`
        (tables by URI or folder name), or the text `orders=1200,customers=310`.
    :param history: versions of each MV searched at most.
    """
    specs = [*(table_spec(item) for item in tables), *(table_spec(item, explicit=False) for item in also)]
    from airflow_backfill.engine.consistency.policies import consistent_versions as choose_versions

    return choose_versions(specs, policy=policy, at=at, history=history)


def table_spec(item: Readable, *, explicit: bool = True) -> TableSpec:
    """The engine's spec of one table to read (a table URI is recognised from its log)."""
    readable = as_readable(item)
    if isinstance(readable, TableSpec):
        return readable if readable.explicit == explicit else TableSpec.from_dict(
            {**readable.to_dict(), "explicit": explicit})
    if isinstance(readable, BackfillJob):
        return spec_for_job(readable, explicit=explicit)
    if isinstance(readable, KafkaBackfillJob):
        return spec_for_kafka_job(readable, explicit=explicit)
    return spec_for_table(readable, explicit=explicit)


def as_readable(item: Readable) -> BackfillJob | KafkaBackfillJob | TableSpec | str:
    """A job, a Kafka backfill job, a spec, or a normalised table URI; job files are loaded
    here (no table is read: DAG files call this when they are parsed)."""
    if isinstance(item, BackfillJob | KafkaBackfillJob | TableSpec):
        return item
    if isinstance(item, KafkaPipeline):
        return item.backfill
    if isinstance(item, Mapping):
        data = dict(item)
        if is_kafka_mapping(data):
            return KafkaPipeline.from_mapping(data, origin="job mapping").backfill
        return BackfillJob.from_mapping(data, origin="job mapping")
    if isinstance(item, str | os.PathLike):
        path = Path(item)
        if path.suffix in JOB_FILE_SUFFIXES:
            return load_any_job(path)
        return normalize_table_uri("table", str(item))
    raise BackfillConfigError(
        f"a table to read must be a job, a job file, a Kafka pipeline or a table URI, got {type(item).__name__}."
    )


def readable_uri(readable: BackfillJob | KafkaBackfillJob | TableSpec | str) -> str:
    """Where a table to read is (`as_readable`'s result)."""
    if isinstance(readable, TableSpec):
        return readable.uri
    return readable if isinstance(readable, str) else readable.target


def load_any_job(path: str | os.PathLike[str]) -> BackfillJob | KafkaBackfillJob:
    """A job file of either shape (`job_folder.load_folder_job`: relative table paths read
    beside it): a Delta job, or a Kafka job (its backfill's MV)."""
    path = Path(path)
    if not path.is_file():
        raise BackfillConfigError(f"job file {path} does not exist; check the path.")
    job = load_folder_job(path, path.resolve().parent)
    return job.backfill if isinstance(job, KafkaPipeline) else job


def job_files_in(folder: str | os.PathLike[str]) -> list[Path]:
    """The job files of a folder (`*.yaml`, `*.yml`), sorted by name."""
    directory = Path(folder)
    if not directory.is_dir():
        raise BackfillConfigError(f"{directory} is not a folder of job files; check the path.")
    found = sorted(path for path in directory.iterdir() if path.suffix in JOB_FILE_SUFFIXES and path.is_file())
    if not found:
        raise BackfillConfigError(f"{directory} holds no job file (*.yaml, *.yml).")
    return found
