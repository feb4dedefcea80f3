"""A task's job, as one more field of the DAG that Airflow serializes to its metadata database.

The DAG processor serializes every DAG it parses; the API server only reads those records
and never runs DAG code. The tasks that carry a job (the phase operators, `pin_epoch`
and the caught-up sensor) add the job's JSON to their serialized fields, so the UI
plugin finds every job, and the DAGs and tasks that declare it, in the metadata database
(plugins/jobs.py). The field is not templated: the job reaches the database as the DAG
file built it.
"""

from __future__ import annotations

from typing import Any

from airflow_backfill.job import BackfillJob

SERIALIZED_JOB_FIELD = "backfill_job"
"""The serialized task's field that holds `BackfillJob.to_json()`."""


class SerializesJob:
    """Mixin for operators with a `job`: its JSON goes into the serialized DAG."""

    job: Any

    @property
    def backfill_job(self) -> str | None:
        """The job as JSON (None for a task whose job is not a `BackfillJob`: not serialized)."""
        return self.job.to_json() if isinstance(self.job, BackfillJob) else None

    @classmethod
    def get_serialized_fields(cls) -> frozenset[str]:
        """Airflow's serialized fields of the operator, and the job."""
        return super().get_serialized_fields() | {SERIALIZED_JOB_FIELD}  # type: ignore[misc]


SERIALIZED_PIPELINE_FIELD = "backfill_kafka_pipeline"
"""The serialized task's field that holds a Kafka pipeline (`KafkaPipeline.to_mapping()` as JSON)."""


class SerializesPipeline:
    """Mixin for operators with a Kafka `pipeline`: its JSON goes into the serialized DAG,
    so the page lists Kafka pipelines beside Delta jobs. It names the brokers' connection,
    never its settings."""

    pipeline: Any

    @property
    def backfill_kafka_pipeline(self) -> str:
        import json

        return json.dumps(self.pipeline.to_mapping(), sort_keys=True)

    @classmethod
    def get_serialized_fields(cls) -> frozenset[str]:
        """Airflow's serialized fields of the operator, and the pipeline."""
        return super().get_serialized_fields() | {SERIALIZED_PIPELINE_FIELD}  # type: ignore[misc]
