"""Example: an MV over a Kafka topic, backfilled per partition while the source job ingests it.

Run with `AIRFLOW_BACKFILL_KAFKA=host:port airflow dags test example_kafka_orders_mv` once a
Kafka broker at that address serves the topic named in jobs/kafka_orders_mv.yaml (the
tests start one on loopback from the jars in jars/kafka-broker: tests/kafka_fixtures.py).
"""

from __future__ import annotations

import os

import pendulum
import yaml
from airflow.sdk import DAG

from airflow_backfill.kafka.config import KafkaPipeline
from airflow_backfill.kafka.task_group import kafka_backfill_task_group

JOB_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "jobs", "kafka_orders_mv.yaml")



def _pipeline() -> KafkaPipeline:
    with open(JOB_FILE, encoding="utf-8") as handle:
        data = yaml.safe_load(handle)
    if os.environ.get("AIRFLOW_BACKFILL_KAFKA"):
        data["upstream"]["bootstrap_servers"] = os.environ["AIRFLOW_BACKFILL_KAFKA"]
    return KafkaPipeline.from_mapping(data, origin=JOB_FILE)


# [START example_kafka_orders_mv]
with DAG(
    dag_id="example_kafka_orders_mv",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["airflow_backfill", "kafka"],
):
    kafka_backfill_task_group(_pipeline(), source_idle_timeout=5.0)
# [END example_kafka_orders_mv]
