"""The Kafka task group, operators and example DAG (no Spark, no broker)."""

from __future__ import annotations

from pathlib import Path

from airflow.sdk import DAG

from airflow_backfill.kafka.config import KafkaPipeline, load_kafka_pipeline
from airflow_backfill.kafka_task_group import kafka_backfill_task_group

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
    assert dag.get_task("orders_mv.source_job").entry_arguments() == ["--beside-backfill", "--backfill-grace", "20.0"]

    with DAG(dag_id="kafka_group_no_source", schedule=None) as dag:
        kafka_backfill_task_group(_pipeline(tmp_path), with_source_job=False)
    assert "orders_mv.source_job" not in dag.task_ids
    assert not dag.get_task("orders_mv.source_backfill").start_source_job


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
    bag = DagBag(dag_folder=str(ROOT / "dags" / "example_kafka_orders_mv.py"))
    assert bag.import_errors == {}
    dag = bag.get_dag("example_kafka_orders_mv")
    assert dag.get_task("kafka_orders_mv.source_job").pipeline.source_job.upstream.kafka_conn_id == "kafka_default"


def test_the_backfill_task_starts_a_source_job_after_the_grace_and_again_at_once_when_it_fails(tmp_path):
    import time

    from airflow_backfill.operators.kafka import KafkaSourceBackfillOperator, SourceJobBeside

    with DAG(dag_id="kafka_companion", schedule=None):
        operator = KafkaSourceBackfillOperator(task_id="b", pipeline=_pipeline(tmp_path), start_source_job=True)
    companion = SourceJobBeside(operator, grace=0.3, poll_interval=0.01)
    other_source_job = [False]
    started: list[float] = []
    outcomes = [False, True]  # the first is killed, the second ends by its bound

    def submit() -> bool:
        started.append(time.monotonic())
        ok = outcomes.pop(0)
        other_source_job[0] = ok  # after that one ended, a source job task runs: no third start
        return ok

    companion._needed = lambda: not other_source_job[0]  # type: ignore[method-assign]
    companion._submit = submit  # type: ignore[method-assign]
    began = time.monotonic()
    companion.start()
    deadline = time.monotonic() + 10
    while len(started) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.5)
    companion.stop(wait=5)
    assert len(started) == 2 and companion.starts == 2
    assert started[0] - began >= 0.3          # only once no source job ran for the grace
    assert started[1] - started[0] < 0.3      # a failed one is started again at once
