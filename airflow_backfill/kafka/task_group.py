"""Build a Kafka source backfill as a task group:

    ingest (source job) -> source_backfill -> wait_finished

`ingest` runs the source job until the topic is idle; in production the source job is a
long-running task of its own DAG and this group only holds the backfill and the sensor
(`with_source_job=False`). XCom carries the per-partition offsets.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import TaskGroup

from airflow_backfill.kafka.config import KafkaPipeline
from airflow_backfill.operators.kafka import KafkaSourceBackfillOperator, KafkaSourceJobOperator
from airflow_backfill.sensors.kafka import SplitsFinishedSensor


def kafka_backfill_task_group(
    pipeline: KafkaPipeline,
    *,
    group_id: str | None = None,
    with_source_job: bool = True,
    source_idle_timeout: float = 10.0,
    backfill_timeout: float | None = 600.0,
    sensor_timeout: float = 600.0,
    conn_id: str = "spark_default",
    **group_kwargs: Any,
) -> TaskGroup:
    """The group for one pipeline (call inside a DAG context)."""
    with TaskGroup(group_id=group_id or pipeline.backfill.name, **group_kwargs) as group:
        backfill = KafkaSourceBackfillOperator(
            task_id="source_backfill", pipeline=pipeline, timeout_seconds=backfill_timeout, conn_id=conn_id,
        )
        wait = SplitsFinishedSensor(task_id="wait_finished", pipeline=pipeline, timeout=sensor_timeout, mode="reschedule")
        if with_source_job:
            ingest = KafkaSourceJobOperator(
                task_id="ingest", pipeline=pipeline, idle_timeout=source_idle_timeout, conn_id=conn_id,
            )
            ingest >> backfill
        backfill >> wait
    return group
