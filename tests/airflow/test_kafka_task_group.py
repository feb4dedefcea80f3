"""The Kafka task group, operators and example DAG (no Spark, no broker)."""

from __future__ import annotations

from pathlib import Path

from airflow.sdk import DAG

from airflow_backfill.kafka.config import KafkaPipeline, load_kafka_pipeline
from airflow_backfill.kafka.task_group import kafka_backfill_task_group

ROOT = Path(__file__).resolve().parents[2]


def _pipeline(tmp_path: Path) -> KafkaPipeline:
    return KafkaPipeline.from_mapping({
        "upstream": {"bootstrap_servers": "127.0.0.1:9092", "topic": "orders", "value_schema": "id BIGINT"},
        "source_job": {"name": "orders_source", "table": str(tmp_path / "orders")},
        "backfill": {"name": "orders_mv", "query": "SELECT id FROM source", "target": str(tmp_path / "mv")},
    })


def test_group_chains_ingest_backfill_and_wait(tmp_path):
    with DAG(dag_id="kafka_group", schedule=None) as dag:
        kafka_backfill_task_group(_pipeline(tmp_path))
    assert dag.get_task("orders_mv.source_backfill").upstream_task_ids == {"orders_mv.ingest"}
    assert dag.get_task("orders_mv.wait_finished").upstream_task_ids == {"orders_mv.source_backfill"}
    with DAG(dag_id="kafka_group_no_source", schedule=None) as dag:
        kafka_backfill_task_group(_pipeline(tmp_path), with_source_job=False)
    assert "orders_mv.ingest" not in dag.task_ids


def test_operators_pass_the_pipeline_as_a_job_file_beside_the_task_logs(tmp_path, monkeypatch):
    from airflow_backfill.operators.kafka import KafkaSourceBackfillOperator

    monkeypatch.setenv("AIRFLOW__LOGGING__BASE_LOG_FOLDER", str(tmp_path / "logs"))
    with DAG(dag_id="kafka_ops", schedule=None):
        operator = KafkaSourceBackfillOperator(task_id="b", pipeline=_pipeline(tmp_path), timeout_seconds=30)
    submitted = {}
    monkeypatch.setattr("airflow.providers.apache.spark.operators.spark_submit.SparkSubmitOperator.execute",
                        lambda self, context: submitted.update(args=list(self.application_args), conf=dict(self.conf)))
    operator.submit({})
    job_file = Path(submitted["args"][submitted["args"].index("--job") + 1])
    assert job_file.parent == tmp_path / "logs" / "airflow_backfill" / "jobs"
    assert load_kafka_pipeline(str(job_file)) == _pipeline(tmp_path)
    assert submitted["args"][-2:] == ["--timeout", "30"]
    assert operator.application.endswith("spark_jobs/kafka_backfill.py")
    assert "spark.jars" in submitted["conf"] and "spark-sql-kafka" in submitted["conf"]["spark.jars"]


def test_kafka_example_dag_imports(monkeypatch, tmp_path):
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("AIRFLOW_BACKFILL_HOME", str(tmp_path))
    monkeypatch.setenv("AIRFLOW_BACKFILL_KAFKA", "127.0.0.1:19092")
    bag = DagBag(dag_folder=str(ROOT / "dags" / "example_kafka_orders_mv.py"))
    assert bag.import_errors == {}
    dag = bag.get_dag("example_kafka_orders_mv")
    assert dag.get_task("kafka_orders_mv.ingest").pipeline.source_job.upstream.bootstrap_servers == "127.0.0.1:19092"
