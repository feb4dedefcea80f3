"""A Kafka MV in a consistent read: its epochs are the source table's versions it records.

The MV's app transaction counts rounds; each commit records, beside its split states, the
source table version it reflects once every split is Finished (`watermark`, null before).
The source table, which only the source job writes, is the base upstream.
"""

from __future__ import annotations

from airflow_backfill.engine.consistency.tables import KIND_RECORDED, SINGLE_UPSTREAM, TableSpec
from airflow_backfill.kafka.config import KafkaBackfillJob


def spec_for_kafka_job(job: KafkaBackfillJob, *, explicit: bool = True) -> TableSpec:
    """The spec of a source backfill's MV, over its source job's table."""
    from airflow_backfill.kafka.positions import WATERMARK_FIELD  # reads logs: not at a DAG's parse

    return TableSpec(job.name, job.target, KIND_RECORDED, job.app_id, {SINGLE_UPSTREAM: job.source_table},
                     epoch_field=WATERMARK_FIELD, explicit=explicit)
