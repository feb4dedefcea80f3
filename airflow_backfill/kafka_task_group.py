"""Build a Kafka source backfill as a task group:

    source_job                       (the shared reader, beside the backfill)
    source_backfill -> wait_finished

`source_job` and `source_backfill` start together. The source job is a long-running
task (unbounded: it keeps ingesting after the backfill finished), or bounded by the
backfill with `source_job_until_finished` (every split Finished) for runs that must end,
such as `airflow dags test`. That command runs one task at a time, so the backfill task
also starts a source job beside itself whenever none has been running for a while
(`KafkaSourceBackfillOperator(start_source_job=True)`); the source table's lock and
heartbeat make sure two never ingest at once. XCom carries the per-partition offsets.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import Asset, TaskGroup

from airflow_backfill.kafka.config import KafkaPipeline
from airflow_backfill.operators.kafka import KafkaSourceBackfillOperator, KafkaSourceJobOperator
from airflow_backfill.sensors.kafka import SplitsFinishedSensor


def kafka_backfill_task_group(
    pipeline: KafkaPipeline,
    *,
    group_id: str | None = None,
    with_source_job: bool = True,
    source_job_until_finished: bool = False,
    source_job_retries: int = 3,
    backfill_timeout: float | None = 600.0,
    sensor_timeout: float = 600.0,
    conn_id: str = "spark_default",
    ready_outlets: Sequence[Asset] = (),
    **group_kwargs: Any,
) -> TaskGroup:
    """The group for one pipeline (call inside a DAG context).

    :param with_source_job: a `source_job` task beside the backfill, and a backfill task
        that starts a source job when none runs. False when the source job runs in a DAG
        of its own: the backfill then waits for it, and says so in its log.
    :param source_job_until_finished: the source job task ends once every split of the
        backfill is Finished (or once no backfill has run for `BACKFILL_GRACE_S`, 20 s) instead of
        running until stopped.
    :param ready_outlets: assets `wait_finished` emits once every split is Finished (the
        folder of jobs schedules the DAGs of MVs over this one on them).
    :param source_job_retries: retries of the source job task (a reader killed or failed
        is started again after 10 s).
    """
    with TaskGroup(group_id=group_id or pipeline.backfill.name, **group_kwargs) as group:
        backfill = KafkaSourceBackfillOperator(
            task_id="source_backfill", pipeline=pipeline, timeout_seconds=backfill_timeout, conn_id=conn_id,
            start_source_job=with_source_job,
        )
        wait = SplitsFinishedSensor(task_id="wait_finished", pipeline=pipeline, timeout=sensor_timeout, mode="reschedule",
                                    outlets=list(ready_outlets))
        if with_source_job:
            KafkaSourceJobOperator(
                task_id="source_job", pipeline=pipeline, conn_id=conn_id, beside_backfill=source_job_until_finished,
                retries=source_job_retries, retry_delay=timedelta(seconds=10),
            )
        backfill >> wait
    return group
