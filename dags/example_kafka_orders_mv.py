"""Example: an MV over a Kafka topic, backfilled per partition while the source job ingests it.

The brokers come from the Airflow connection `kafka_default` named in
jobs/kafka_orders_mv.yaml. `airflow-backfill kafka-demo` starts a broker on 127.0.0.1:9092
with the topic and a producer, and `scripts/env.sh` defines the connection for it; then
`airflow dags test example_kafka_orders_mv` (see docs/kafka.md).
"""

from __future__ import annotations

import os

import pendulum
import yaml
from airflow.sdk import DAG

from airflow_backfill.kafka.config import KafkaPipeline
from airflow_backfill.kafka_task_group import kafka_backfill_task_group

JOB_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "jobs", "kafka_orders_mv.yaml")


def _pipeline() -> KafkaPipeline:
    with open(JOB_FILE, encoding="utf-8") as handle:
        return KafkaPipeline.from_mapping(yaml.safe_load(handle), origin=JOB_FILE)


# [START example_kafka_orders_mv]
with DAG(
    dag_id="example_kafka_orders_mv",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["airflow_backfill", "kafka"],
):
    # The source job runs beside the backfill and ends once every split is Finished, so
    # a test run ends; drop source_job_until_finished to keep it ingesting.
    kafka_backfill_task_group(_pipeline(), source_job_until_finished=True)
# [END example_kafka_orders_mv]
