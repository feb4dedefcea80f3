"""A job the engine cannot maintain is a DAG import error naming the job and the construct,
when the DAG file is parsed, before any task runs."""

from __future__ import annotations

from pathlib import Path

from airflow.dag_processing.dagbag import DagBag

DAG_FILE = """
import pendulum
from airflow.sdk import DAG

from airflow_backfill.task_group import backfill_task_group

with DAG("distinct_mv", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")):
    backfill_task_group("jobs/distinct_mv.yaml")
"""
JOB_FILE = """name: distinct_mv
source: {lake}/orders
target: {lake}/distinct_mv
query: SELECT DISTINCT order_id, status FROM source LIMIT 5
primary_key: [order_id]
"""
KAFKA_DAG_FILE = """
import pendulum
from airflow.sdk import DAG

from airflow_backfill.kafka.config import load_kafka_pipeline
from airflow_backfill.kafka_task_group import kafka_backfill_task_group

with DAG("kinds", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")):
    kafka_backfill_task_group(load_kafka_pipeline({path!r}))
"""
KAFKA_FILE = """upstream: {{bootstrap_servers: "127.0.0.1:9092", topic: orders, value_schema: "id BIGINT, kind STRING"}}
source_job: {{name: orders_source, table: {lake}/orders_topic}}
backfill: {{name: kinds, target: {lake}/kinds, query: "SELECT id, COUNT(DISTINCT kind) AS n FROM source GROUP BY id"}}
"""


def test_a_dag_over_an_unsupported_query_is_an_import_error_naming_the_job_file_and_the_construct(tmp_path):
    dags = tmp_path / "dags"
    (dags / "jobs").mkdir(parents=True)
    job_file = dags / "jobs" / "distinct_mv.yaml"
    job_file.write_text(JOB_FILE.format(lake=tmp_path / "lake"))
    (dags / "distinct_mv.py").write_text(DAG_FILE)
    bag = DagBag(dag_folder=str(dags))
    assert bag.dag_ids == []
    [(dag_file, error)] = bag.import_errors.items()
    assert Path(dag_file).name == "distinct_mv.py"
    assert f"job file {job_file}: DISTINCT (use GROUP BY over the selected columns) is not supported" in error
    # Fixed, the same file imports.
    job_file.write_text(JOB_FILE.format(lake=tmp_path / "lake").replace("DISTINCT ", "").replace(" LIMIT 5", ""))
    fixed = DagBag(dag_folder=str(dags))
    assert fixed.import_errors == {} and fixed.dag_ids == ["distinct_mv"]


def test_a_kafka_dag_over_an_unsupported_query_is_an_import_error(tmp_path):
    job_file = tmp_path / "kinds.yaml"
    job_file.write_text(KAFKA_FILE.format(lake=tmp_path / "lake"))
    (tmp_path / "dags").mkdir()
    (tmp_path / "dags" / "kinds.py").write_text(KAFKA_DAG_FILE.format(path=str(job_file)))
    bag = DagBag(dag_folder=str(tmp_path / "dags"))
    [error] = bag.import_errors.values()
    assert f"job file {job_file}" in error
    assert "COUNT(DISTINCT ...) is not supported over a Kafka topic" in error
