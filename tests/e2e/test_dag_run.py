"""A backfill DAG triggered with `airflow dags trigger --conf ...` and run by a real
Airflow (scheduler, DAG processor, triggerer and API server on loopback, LocalExecutor)
against a Spark standalone cluster on loopback, while a simulator keeps writing the
upstream: every phase runs as an application of the cluster, a deferrable sensor waits
in the triggerer, forward is stopped by marking its task failed, and the MV equals the
query recomputed independently at its watermark after every commit."""

from __future__ import annotations

import signal
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest
from airflow_processes import (
    airflow_env,
    prepare_database,
    run_airflow,
    start,
    stop,
    wait_until_healthy,
)
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError
from helpers_delta import mv_commits
from test_spark_submit import start_simulator

from airflow_backfill.job import BackfillJob
from airflow_backfill.loopback import free_port
from oracle import assert_every_commit_matches

pytestmark = pytest.mark.e2e

DAG_ID = "scheduled_orders_mv"
RUN_ID = "triggered_from_the_cli"
RUN_TIMEOUT_S = 900
QUERY = "SELECT order_id, customer_id, status, amount * quantity AS total FROM source WHERE status <> 'cancelled'"

DAG_FILE = '''
import pendulum
from airflow.sdk import DAG

from airflow_backfill.job import BackfillJob
from airflow_backfill.sensors.lag import CaughtUpSensor
from airflow_backfill.task_group import FORWARD_BOUNDS_FROM_PARAMS, backfill_task_group, forward_bound_params

JOB = BackfillJob(**{job!r})

with DAG("{dag_id}", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False,
         params=forward_bound_params(max_epochs=3, idle_timeout=30)):
    backfill_task_group(JOB, **FORWARD_BOUNDS_FROM_PARAMS)
    # What a consumer of the MV does: wait, in the triggerer, until the MV exists (and trails
    # the live upstream by at most 100 epochs).
    CaughtUpSensor(task_id="consumer_waits_for_fresh_mv", job=JOB, lag_threshold=100, timeout=600,
                   trigger_poll_interval=1.0)
'''


@dataclass(frozen=True)
class RunningAirflow:
    env: dict[str, str]
    url: str
    logs: dict[str, Path]
    token: str

    def get(self, path: str) -> dict:
        response = httpx.get(f"{self.url}/api/v2{path}", headers={"Authorization": f"Bearer {self.token}"},
                             timeout=30)
        response.raise_for_status()
        return response.json()


@pytest.fixture
def running_airflow(tmp_path, spark_cluster, job: BackfillJob) -> Iterator[RunningAirflow]:
    """The four Airflow components of a deployment, sharing one home and SQLite database."""
    home = tmp_path / "airflow"
    dags = home / "dags"
    dags.mkdir(parents=True)
    fields = {"name": job.name, "source": job.source, "target": job.target, "query": job.query,
              "primary_key": list(job.primary_key), "backfill_parallelism": 2, "parallelism": 1,
              "lag_threshold": job.lag_threshold}
    (dags / "scheduled_orders_mv.py").write_text(textwrap.dedent(DAG_FILE.format(job=fields, dag_id=DAG_ID)))
    url = f"http://127.0.0.1:{free_port()}"
    env = {
        **airflow_env(home, dags, url, {"admin": "admin-secret"}, {"admin": "admin"}),
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{url}/execution/",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": "True",
        "AIRFLOW_CONN_SPARK_DEFAULT": f"{spark_cluster.master_url}?deploy-mode=client",
    }
    prepare_database(home / "airflow.db", env)
    components = {
        "api-server": ["api-server", "--host", "127.0.0.1", "--port", url.rsplit(":", 1)[1], "--workers", "1"],
        "scheduler": ["scheduler", "--skip-serve-logs"],
        "dag-processor": ["dag-processor"],
        "triggerer": ["triggerer", "--skip-serve-logs"],
    }
    started = {name: (start(args, env, home / f"{name}.log"), home / f"{name}.log")
               for name, args in components.items()}
    try:
        wait_until_healthy(f"{url}/api/v2/monitor/health", started)
        token = httpx.post(f"{url}/auth/token", json={"username": "admin", "password": "admin-secret"}, timeout=30)
        token.raise_for_status()
        yield RunningAirflow(env=env, url=url, logs={name: log for name, (_, log) in started.items()},
                             token=token.json()["access_token"])
    finally:
        stop([process for process, _ in started.values()])


@pytest.fixture
def job(tmp_path) -> BackfillJob:
    return BackfillJob(name="scheduled_orders_mv", source=str(tmp_path / "orders"),
                       target=str(tmp_path / "orders_mv"), query=QUERY, primary_key=("order_id",),
                       backfill_parallelism=2, parallelism=1, lag_threshold=1)


def wait_for(condition, what: str, timeout: float, airflow: RunningAirflow):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(2)
    logs = "\n".join(f"--- {name}\n{log.read_text()[-3000:]}" for name, log in airflow.logs.items())
    raise AssertionError(f"{what} not within {timeout:.0f}s\n{logs}")


def _parsed(airflow: RunningAirflow, dag_id: str = DAG_ID) -> bool:
    try:
        return bool(airflow.get(f"/dags/{dag_id}"))
    except httpx.HTTPStatusError:
        return False


def _forward_committed(job: BackfillJob) -> bool:
    try:
        commits = mv_commits(job.target)
    except TableNotFoundError:  # the snapshot has not created the MV yet
        return False
    return any(c.get("airflow_backfill.phase") == "forward" for c in commits)


def _forward_processes() -> list[psutil.Process]:
    """The forward phase's spark-submit JVM and Python driver (both carry forward.py --job)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        command = " ".join(process.info["cmdline"] or [])
        if "forward.py" in command and "--job " in command:
            found.append(process)
    return found


def test_a_triggered_run_backfills_a_live_upstream_and_stops_forward_when_marked_failed(
    job, running_airflow, spark_cluster, kafka_broker, tmp_path,
):
    """Forward runs unbounded until the test marks its task failed, as a user does in the UI:
    Airflow's supervisor stops the task, the driver ends without tearing a commit. Then the
    same Airflow runs a Kafka source backfill beside its source job (`run_kafka_dag`)."""
    airflow = running_airflow
    simulator = start_simulator(job.source, seed=11)
    try:
        started_from = DeltaTable(job.source).version()
        wait_for(lambda: _parsed(airflow), "the DAG processor parsing the DAG", 180, airflow)
        triggered = run_airflow("dags", "trigger", DAG_ID, "--run-id", RUN_ID, "--conf",
                                '{"forward_max_epochs": null, "forward_idle_timeout": null}', env=airflow.env)
        assert triggered.returncode == 0, triggered.stdout[-3000:] + triggered.stderr[-3000:]
        wait_for(lambda: _forward_committed(job), "a forward commit", RUN_TIMEOUT_S, airflow)
        assert _forward_processes(), "forward committed but its driver is not running"
        marked = httpx.patch(
            f"{airflow.url}/api/v2/dags/{DAG_ID}/dagRuns/{RUN_ID}/taskInstances/{job.name}.forward",
            json={"new_state": "failed"}, headers={"Authorization": f"Bearer {airflow.token}"}, timeout=30)
        assert marked.status_code == 200, marked.text
        marked_at = time.monotonic()
        wait_for(lambda: not _forward_processes(), "forward's processes ending", 60, airflow)
        stop_seconds = time.monotonic() - marked_at
        state = wait_for(
            lambda: (s := airflow.get(f"/dags/{DAG_ID}/dagRuns/{RUN_ID}")["state"]) in ("success", "failed") and s,
            "the run ending", 120, airflow,
        )
        assert simulator.poll() is None, "the upstream stopped during the run"
    finally:
        simulator.send_signal(signal.SIGTERM)
        simulator.wait(timeout=60)
    print(f"forward's processes ended {stop_seconds:.1f} s after its task was marked failed")
    tasks = {ti["task_id"]: ti["state"]
             for ti in airflow.get(f"/dags/{DAG_ID}/dagRuns/{RUN_ID}/taskInstances")["task_instances"]}
    assert state == "failed" and tasks[f"{job.name}.forward"] == "failed", (state, tasks)
    for task in ("pin_epoch", "snapshot", "catch_up", "wait_caught_up"):
        assert tasks[f"{job.name}.{task}"] == "success", tasks
    assert tasks["consumer_waits_for_fresh_mv"] == "success", tasks
    logs = Path(airflow.env["AIRFLOW_HOME"]) / "logs"
    task_logs = {log.parent.name: log.read_text(errors="replace") for log in logs.rglob("attempt=1.log")}
    # The consumer's sensor found no MV at its first poke and deferred; the triggerer ran the
    # trigger until it fired success.
    trigger_logs = " ".join(log.read_text() for log in logs.rglob("attempt=1.log.trigger.*.log")
                            if log.parent.name == "task_id=consumer_waits_for_fresh_mv")
    assert "Trigger fired event" in trigger_logs and "'status': 'success'" in trigger_logs, trigger_logs[-3000:]
    # The operators sized the cluster applications: executors x cores from each phase's parallelism.
    assert "spark.executor.cores=2" in task_logs[f"task_id={job.name}.snapshot"]
    assert "spark.executor.cores=1" in task_logs[f"task_id={job.name}.forward"]
    # The stop reached the driver through the operator's on_kill (SIGTERM, then the grace).
    assert "stopping forward: SIGTERM to the driver" in task_logs[f"task_id={job.name}.forward"]
    names = " ".join(app["name"] for app in spark_cluster.state().get("completedapps", []))
    for phase in ("snapshot", "catch_up", "forward"):
        assert f"{job.name}:{phase}" in names, f"the {phase} phase did not run on the cluster: {names}"
    watermark = DeltaTable(job.target).transaction_version(job.app_id)
    assert watermark is not None and watermark >= started_from
    checked = assert_every_commit_matches(job.source, job.target, job.query, job.app_id, key=list(job.primary_key))
    assert checked >= 3  # snapshot, at least one catch-up round, at least one forward commit
    assert {c["airflow_backfill.phase"] for c in mv_commits(job.target)} >= {"snapshot", "catch_up", "forward"}
    run_kafka_dag(airflow, kafka_broker, tmp_path / "kafka")


KAFKA_DAG_ID = "scheduled_kafka_orders_mv"
KAFKA_DAG_FILE = '''
import pendulum
from airflow.sdk import DAG

from airflow_backfill.kafka.config import KafkaPipeline
from airflow_backfill.kafka_task_group import kafka_backfill_task_group

with DAG("{dag_id}", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False):
    kafka_backfill_task_group(KafkaPipeline.from_mapping({pipeline!r}), source_job_until_finished=True,
                              conn_id="spark_local")
'''


def run_kafka_dag(airflow: RunningAirflow, kafka_broker, tables: Path) -> None:
    """The Kafka example's task group run by the scheduler (local Spark, the brokers from a
    `kafka` connection) while records arrive: the source job task and the backfill run side
    by side, and every record is in the source table and the MV exactly once, every split
    Finished (test_kafka_dag kills the source job's driver under `dags test`)."""
    from kafka_oracle import QUERY, assert_oracle, assert_source_table

    from airflow_backfill.kafka.config import KafkaPipeline
    from airflow_backfill.kafka.positions import backfill_position
    from airflow_backfill.kafka.simulator import VALUE_SCHEMA, KafkaSimulator

    headers = {"Authorization": f"Bearer {airflow.token}"}
    for connection in (
        {"connection_id": "spark_local", "conn_type": "spark", "host": "local", "extra": '{"deploy-mode": "client"}'},
        {"connection_id": "kafka_scheduled", "conn_type": "kafka",
         "extra": f'{{"bootstrap.servers": "{kafka_broker.bootstrap_servers}"}}'},
    ):
        for _ in range(3):  # the API server's SQLite may refuse a write under a loaded machine: a 500, retried
            created = httpx.post(f"{airflow.url}/api/v2/connections", json=connection, headers=headers, timeout=30)
            if created.status_code != 500:
                break
            time.sleep(2)
        assert created.status_code == 201, created.text
    simulator = KafkaSimulator(kafka_broker.bootstrap_servers, "scheduled-orders")
    pipeline = KafkaPipeline.from_mapping({
        "upstream": {"kafka_conn_id": "kafka_scheduled", "topic": simulator.topic, "value_schema": VALUE_SCHEMA},
        "source_job": {"name": "scheduled_orders_source", "table": str(tables / "orders")},
        "backfill": {"name": "scheduled_kafka_orders_mv", "query": QUERY, "target": str(tables / "mv"),
                     "backfill_parallelism": 1},
    })
    dags = Path(airflow.env["AIRFLOW__CORE__DAGS_FOLDER"])
    (dags / f"{KAFKA_DAG_ID}.py").write_text(KAFKA_DAG_FILE.format(dag_id=KAFKA_DAG_ID,
                                                                   pipeline=pipeline.to_mapping()))
    stop = threading.Event()
    producer = threading.Thread(target=simulator.produce_at_rates, args=({0: 10.0, 1: 10.0}, 1800.0, stop))
    try:
        simulator.create_topic(2)
        simulator.produce({0: 150, 1: 100})
        producer.start()
        wait_for(lambda: _parsed(airflow, KAFKA_DAG_ID), "the DAG processor parsing the Kafka DAG", 180, airflow)
        triggered = run_airflow("dags", "trigger", KAFKA_DAG_ID, "--run-id", RUN_ID, env=airflow.env)
        assert triggered.returncode == 0, triggered.stdout[-3000:] + triggered.stderr[-3000:]
        state = wait_for(
            lambda: (s := airflow.get(f"/dags/{KAFKA_DAG_ID}/dagRuns/{RUN_ID}")["state"]) in ("success", "failed") and s,
            "the Kafka run ending", RUN_TIMEOUT_S, airflow,
        )
    finally:
        stop.set()
        producer.join(timeout=60)
        simulator.close()
    instances = airflow.get(f"/dags/{KAFKA_DAG_ID}/dagRuns/{RUN_ID}/taskInstances")["task_instances"]
    tasks = {ti["task_id"]: (ti["state"], ti["try_number"]) for ti in instances}
    assert state == "success" and {task_state for task_state, _ in tasks.values()} == {"success"}, tasks
    final = backfill_position(pipeline.backfill.target)
    assert final.finished and set(final.splits) == {0, 1}, final.splits
    assert_oracle(pipeline.backfill.target, simulator.produced)
    assert_source_table(pipeline.source_job.table, simulator.produced)
    print(f"Kafka DAG under the scheduler: tasks {tasks}")

