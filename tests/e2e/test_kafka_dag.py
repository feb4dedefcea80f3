"""`airflow dags test example_kafka_orders_mv` against the loopback broker: the example DAG
as a user runs it (source job, source backfill and the splits sensor as spark-submit
tasks), and the MV equals the query over every produced record at or below its split
offsets, all of them Finished."""

from __future__ import annotations

import os

import pytest
from airflow_processes import ROOT, prepare_database, run_airflow
from kafka_oracle import assert_oracle

from airflow_backfill.kafka.config import load_kafka_pipeline
from airflow_backfill.kafka.simulator import KafkaSimulator

pytestmark = pytest.mark.e2e


def test_the_example_kafka_dag_backfills_every_partition(tmp_path, kafka_broker, monkeypatch):
    env = {**os.environ, "AIRFLOW_BACKFILL_KAFKA": kafka_broker.bootstrap_servers,
           "AIRFLOW_BACKFILL_HOME": str(tmp_path / "tables"), "AIRFLOW_HOME": str(tmp_path / "airflow"),
           "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags")}
    (tmp_path / "airflow").mkdir()
    prepare_database(tmp_path / "airflow" / "airflow.db", env)
    simulator = KafkaSimulator(kafka_broker.bootstrap_servers, "orders")  # the topic jobs/kafka_orders_mv.yaml names
    try:
        simulator.create_topic(4)
        produced = simulator.produce({0: 300, 1: 200, 2: 250, 3: 150})
    finally:
        simulator.close()

    run = run_airflow("dags", "test", "example_kafka_orders_mv", env=env, timeout=900)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-5000:]
    assert "4/4 partitions Finished" in output

    monkeypatch.setenv("AIRFLOW_BACKFILL_HOME", env["AIRFLOW_BACKFILL_HOME"])  # the job file's ${...}
    target = load_kafka_pipeline(str(ROOT / "jobs" / "kafka_orders_mv.yaml")).backfill.target
    # every split read to its last produced offset, each record once
    assert assert_oracle(target, produced) == {0: 299, 1: 199, 2: 249, 3: 149}
