"""`airflow dags test example_kafka_orders_mv` as a user runs it, against a topic that
receives records for the whole run, with the brokers known only through an Airflow
connection (`AIRFLOW_CONN_KAFKA_DEFAULT`, SASL) and the source job SIGKILLed once while
the backfill runs: every produced record is in the source table and the MV exactly once
(at their committed offsets), every split is Finished, and the connection's password is
in no process's command line, in the run's output or in the Airflow home."""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest
from airflow_processes import ROOT, prepare_database, run_airflow
from kafka_fixtures import SASL_USER, sasl_connection
from kafka_oracle import assert_oracle, assert_source_table
from test_object_store_dag import CommandLineWatch

from airflow_backfill.engine.delta.log import table_exists
from airflow_backfill.kafka.config import load_kafka_pipeline
from airflow_backfill.kafka.positions import backfill_position
from airflow_backfill.kafka.simulator import KafkaSimulator

pytestmark = pytest.mark.e2e


def source_job_drivers() -> list[psutil.Process]:
    """The Python drivers of running source jobs (spark-submit starts them with the job file)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        command = process.info.get("cmdline") or []
        if any(part.endswith("kafka_source.py") for part in command) and "--job" in command and \
                "java" not in os.path.basename(command[0]):
            found.append(process)
    return found


class KillSourceJobOnce(threading.Thread):
    """SIGKILLs the first source job driver seen while the backfill runs (its MV exists and
    not every split is Finished yet)."""

    def __init__(self, target: str) -> None:
        super().__init__(daemon=True)
        self.target = target
        self.killed: str | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.5) and self.killed is None:
            if not table_exists(self.target) or backfill_position(self.target).finished:
                continue
            for process in source_job_drivers():
                try:
                    process.send_signal(signal.SIGKILL)
                except psutil.NoSuchProcess:
                    continue
                self.killed = f"pid {process.pid}"
                return


def test_the_example_kafka_dag_backfills_a_live_topic_beside_its_source_job(tmp_path, kafka_broker, monkeypatch):
    tables = tmp_path / "tables"
    env = {**os.environ, "AIRFLOW_BACKFILL_HOME": str(tables), "AIRFLOW_HOME": str(tmp_path / "airflow"),
           "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"), "AIRFLOW_CONN_KAFKA_DEFAULT": sasl_connection(kafka_broker)}
    (tmp_path / "airflow").mkdir()
    prepare_database(tmp_path / "airflow" / "airflow.db", env)
    monkeypatch.setenv("AIRFLOW_BACKFILL_HOME", str(tables))  # the job file's ${...}
    pipeline = load_kafka_pipeline(str(ROOT / "jobs" / "kafka_orders_mv.yaml"))
    password = kafka_broker.sasl_users[SASL_USER]

    simulator = KafkaSimulator(kafka_broker.bootstrap_servers, "orders")  # the topic the job file names
    stop = threading.Event()
    producer = threading.Thread(target=simulator.produce_at_rates, args=({0: 15.0, 1: 15.0}, 1800.0, stop))
    killer = KillSourceJobOnce(pipeline.backfill.target)
    try:
        simulator.create_topic(2)
        simulator.produce({0: 300, 1: 200})
        producer.start()
        killer.start()
        started = time.monotonic()
        with CommandLineWatch(password) as watch:
            run = run_airflow("dags", "test", "example_kafka_orders_mv", env=env, timeout=900)
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        killer.stop.set()
        producer.join(timeout=60)
        simulator.close()
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-6000:]
    print(f"airflow dags test took {elapsed:.0f} s; source job killed: {killer.killed}")

    assert killer.killed is not None, "the source job was never seen running beside the backfill"
    assert "starting the source job beside the backfill again" in output  # the backfill task restarted it
    final = backfill_position(pipeline.backfill.target)
    assert final.finished and set(final.splits) == {0, 1}, final.splits
    offsets = assert_oracle(pipeline.backfill.target, simulator.produced)
    assert offsets[0] >= 299 and offsets[1] >= 199  # at least what was there before the run
    assert_source_table(pipeline.source_job.table, simulator.produced)

    assert watch.scans > 10 and watch.seen == [], watch.seen[:3]
    assert password not in output
    for path in (tmp_path / "airflow").rglob("*"):
        if path.is_file():
            assert password.encode() not in path.read_bytes(), f"the connection's password is in {path}"
