"""The Kafka task group, operators and example DAG (no Spark, no broker)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from airflow.sdk import DAG

from airflow_backfill.kafka.config import KafkaPipeline
from airflow_backfill.kafka.task_group import kafka_backfill_task_group

ROOT = Path(__file__).resolve().parents[2]


def _pipeline(tmp_path: Path) -> KafkaPipeline:
    return KafkaPipeline.from_mapping({
        "upstream": {"bootstrap_servers": "127.0.0.1:9092", "topic": "orders", "value_schema": "id BIGINT"},
        "source_job": {"name": "orders_source", "table": str(tmp_path / "orders")},
        "backfill": {"name": "orders_mv", "query": "SELECT id FROM source", "target": str(tmp_path / "mv")},
    })


def test_the_source_job_runs_beside_the_backfill(tmp_path):
    with DAG(dag_id="kafka_group", schedule=None) as dag:
        kafka_backfill_task_group(_pipeline(tmp_path))
    source_job, backfill = dag.get_task("orders_mv.source_job"), dag.get_task("orders_mv.source_backfill")
    assert source_job.upstream_task_ids == set() and backfill.upstream_task_ids == set()  # side by side
    assert dag.get_task("orders_mv.wait_finished").upstream_task_ids == {"orders_mv.source_backfill"}
    assert backfill.start_source_job and not source_job.beside_backfill and source_job.retries == 3
    assert "--beside-backfill" not in source_job.entry_arguments()  # unbounded: the long-running reader

    with DAG(dag_id="kafka_group_bounded", schedule=None) as dag:
        kafka_backfill_task_group(_pipeline(tmp_path), source_job_until_finished=True)
    assert dag.get_task("orders_mv.source_job").entry_arguments() == ["--beside-backfill", "--backfill-grace", "60.0"]

    with DAG(dag_id="kafka_group_no_source", schedule=None) as dag:
        kafka_backfill_task_group(_pipeline(tmp_path), with_source_job=False)
    assert "orders_mv.source_job" not in dag.task_ids
    assert not dag.get_task("orders_mv.source_backfill").start_source_job


def test_operators_pass_the_pipeline_as_base64_json(tmp_path, monkeypatch):
    from airflow_backfill.operators.kafka import KafkaSourceBackfillOperator

    with DAG(dag_id="kafka_ops", schedule=None):
        operator = KafkaSourceBackfillOperator(task_id="b", pipeline=_pipeline(tmp_path), timeout_seconds=30)
    submitted = {}
    monkeypatch.setattr("airflow.providers.apache.spark.operators.spark_submit.SparkSubmitOperator.execute",
                        lambda self, context: submitted.update(args=list(self.application_args), conf=dict(self.conf)))
    operator.submit({})
    encoded = submitted["args"][submitted["args"].index("--job-b64") + 1]
    assert KafkaPipeline.from_mapping(json.loads(base64.b64decode(encoded))) == _pipeline(tmp_path)
    assert submitted["args"][-2:] == ["--timeout", "30"]
    assert operator.application.endswith("spark_jobs/kafka_backfill.py")
    assert "spark.jars" in submitted["conf"] and "spark-sql-kafka" in submitted["conf"]["spark.jars"]


def test_kafka_example_dag_imports(monkeypatch, tmp_path):
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("AIRFLOW_BACKFILL_HOME", str(tmp_path))
    bag = DagBag(dag_folder=str(ROOT / "dags" / "example_kafka_orders_mv.py"))
    assert bag.import_errors == {}
    dag = bag.get_dag("example_kafka_orders_mv")
    assert dag.get_task("kafka_orders_mv.source_job").pipeline.source_job.upstream.kafka_conn_id == "kafka_default"
