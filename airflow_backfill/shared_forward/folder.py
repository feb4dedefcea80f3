"""The shared forward's members from a folder of job files (`job_folder.py`), read again
at every reload: a Delta job is one member, a Kafka pipeline two (its source job and its
MV).

With `backfill`, the Delta jobs' members build their MVs too (a folder backfilled as one);
without `kafka`, the Kafka pipelines are left out (`airflow-backfill backfill --jobs-in`,
which builds the Delta MVs and ends: a source job ingests for as long as it lives).
"""

from __future__ import annotations

import os

from airflow_backfill.job_folder import load_job_folder
from airflow_backfill.kafka.config import KafkaPipeline
from airflow_backfill.shared_forward.loop import MemberSet
from airflow_backfill.shared_forward.members import DeltaMember, KafkaMvMember, KafkaSourceMember, Member


def folder_members(folder: str | os.PathLike[str], parallelism: int | None = None, *,
                   backfill: bool = False, kafka: bool = True) -> MemberSet:
    """Every member the folder declares, and its job files that failed to load."""
    loaded = load_job_folder(folder)
    members: dict[str, Member] = {}
    declarations: dict[str, object] = {}
    files: dict[str, str] = {}
    for entry in loaded.jobs:
        if isinstance(entry.job, KafkaPipeline):
            if not kafka:
                continue
            source = entry.job.source_job
            key = f"source:{source.name}"
            members[key] = KafkaSourceMember(source)
            declarations[key] = source
            files[key] = entry.path
            members[entry.name] = KafkaMvMember(entry.job.backfill)
            declarations[entry.name] = entry.job.backfill
        else:
            members[entry.name] = DeltaMember(entry.job, parallelism, backfill=backfill)
            declarations[entry.name] = (entry.job, parallelism)
        files[entry.name] = entry.path
    return MemberSet(members, {error.path: error.message for error in loaded.errors}, declarations, files)
