"""Brokers from an Airflow connection of the `kafka` type: its settings for kafka-python and
for Spark's Kafka source, its validation, and the CLI, sensor and trigger reaching the
tests' broker through its SASL listener with the connection alone (`AIRFLOW_CONN_<ID>`)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import context_with
from kafka_fixtures import SASL_USER, sasl_connection

from airflow_backfill.exceptions import BackfillConfigError, UpstreamError
from airflow_backfill.kafka.config import KafkaPipeline, KafkaTopic
from airflow_backfill.kafka.connection import (
    ENVIRONMENT,
    KafkaSettings,
    broker_settings,
    settings_from_connection,
)
from airflow_backfill.kafka.simulator import VALUE_SCHEMA

ROOT = Path(__file__).resolve().parents[2]


def _pipeline(topic: str, tables: Path, conn_id: str = "kafka_sasl") -> KafkaPipeline:
    return KafkaPipeline.from_mapping({
        "upstream": {"kafka_conn_id": conn_id, "topic": topic, "value_schema": VALUE_SCHEMA},
        "source_job": {"name": "src", "table": str(tables / "orders")},
        "backfill": {"name": "mv", "query": "SELECT id FROM source", "target": str(tables / "mv")},
    })


def test_sasl_ssl_settings_reach_both_clients_and_hide_their_secrets(tmp_path):
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\nCA\n")
    settings = KafkaSettings.from_extra({
        "bootstrap.servers": "b1:9093,b2:9093", "security.protocol": "sasl_ssl", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "mv", "sasl.password": 'p"w', "ssl.ca.location": str(tmp_path / "ca.pem"),
        "ssl.endpoint.identification.algorithm": "none", "group.id": "ignored",
    }, "kafka_prod")
    assert settings.client_kwargs() == {
        "bootstrap_servers": ["b1:9093", "b2:9093"], "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "mv", "sasl_plain_password": 'p"w', "ssl_cafile": str(tmp_path / "ca.pem"),
        "ssl_check_hostname": False,
    }
    options = settings.spark_options()
    assert options["kafka.sasl.jaas.config"] == (
        'org.apache.kafka.common.security.scram.ScramLoginModule required username="mv" password="p\\"w";')
    assert options["kafka.ssl.truststore.type"] == "PEM"
    assert options["kafka.ssl.truststore.certificates"].startswith("-----BEGIN CERTIFICATE-----")
    assert options["kafka.ssl.endpoint.identification.algorithm"] == ""
    assert settings.secrets() == ['p"w'] and 'p"w' not in repr(settings)
    assert KafkaSettings.from_extra(json.loads(settings.to_json()), "kafka_prod") == settings


@pytest.mark.parametrize(("extra", "message"), [
    ({"security.protocol": "PLAINTEXT"}, "has no bootstrap.servers"),
    ({"bootstrap.servers": "b1"}, "must be 'host:port'"),
    ({"bootstrap.servers": "b1:9092", "sasl.kerberos.service.name": "kafka"}, "unsupported .*sasl.kerberos"),
    ({"bootstrap.servers": "b1:9092", "security.protocol": "TLS"}, "security.protocol must be one of"),
    ({"bootstrap.servers": "b1:9092", "security.protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI"},
     "sasl.mechanism must be one of"),
    ({"bootstrap.servers": "b1:9092", "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
      "sasl.username": "u"}, "needs sasl.username and sasl.password"),
])
def test_bad_connection_settings_are_refused_by_name(extra, message):
    with pytest.raises(BackfillConfigError, match=message):
        KafkaSettings.from_extra(extra, "kafka_prod")


def test_the_job_names_its_brokers_one_way_and_a_connection_must_be_of_the_kafka_type(monkeypatch):
    with pytest.raises(BackfillConfigError, match="either bootstrap_servers .* or kafka_conn_id .* not both"):
        KafkaTopic("b1:9092", "orders", VALUE_SCHEMA, kafka_conn_id="kafka_default")
    with pytest.raises(BackfillConfigError, match="not neither"):
        KafkaTopic(None, "orders", VALUE_SCHEMA)
    monkeypatch.setenv("AIRFLOW_CONN_NOT_KAFKA", "spark://local")
    with pytest.raises(BackfillConfigError, match="of type 'spark'; kafka_conn_id needs a 'kafka' connection"):
        settings_from_connection("not_kafka")
    with pytest.raises(BackfillConfigError, match="is not an Airflow connection.*AIRFLOW_CONN_NO_SUCH"):
        settings_from_connection("no_such")
    # What an operator handed the driver wins over a lookup (the driver has no connection).
    monkeypatch.setenv(ENVIRONMENT, KafkaSettings("h:1", conn_id="kafka_handed").to_json())
    assert broker_settings(KafkaTopic(None, "orders", VALUE_SCHEMA, kafka_conn_id="kafka_handed")).bootstrap_servers == "h:1"


def test_operators_hand_the_connection_to_spark_submit_in_its_environment_only(tmp_path, monkeypatch, kafka_broker):
    from airflow.sdk import DAG

    from airflow_backfill.operators import kafka as kafka_operators

    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_SASL", sasl_connection(kafka_broker))
    masked: list[str] = []
    monkeypatch.setattr("airflow.sdk.log.mask_secret", masked.append)
    with DAG(dag_id="kafka_conn_ops", schedule=None):
        operator = kafka_operators.KafkaSourceJobOperator(task_id="s", pipeline=_pipeline("orders", tmp_path))
    operator.prepare()
    password = kafka_broker.sasl_users[SASL_USER]
    assert password in masked  # besides what Airflow masks of the connection itself
    assert password not in json.dumps([operator.application_args, operator.conf])
    handed = json.loads(operator.env_vars[ENVIRONMENT])
    assert handed["sasl.password"] == password and handed["conn_id"] == "kafka_sasl"


def test_cli_sensor_and_trigger_reach_a_broker_known_only_through_a_connection(kafka_broker, kafka_simulator, tmp_path,
                                                                              monkeypatch):
    from airflow_backfill.sensors.kafka import SplitsFinishedSensor
    from airflow_backfill.triggers.kafka import SplitsFinishedTrigger

    kafka_simulator.create_topic(3)
    pipeline = _pipeline(kafka_simulator.topic, tmp_path)
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(pipeline.to_mapping()))
    password = kafka_broker.sasl_users[SASL_USER]
    env = {**os.environ, "AIRFLOW_CONN_KAFKA_SASL": sasl_connection(kafka_broker)}
    env.pop(ENVIRONMENT, None)
    command = [str(Path(sys.executable).with_name("airflow-backfill")), "kafka-status", "--job", str(job_file), "--json"]
    status = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert status.returncode == 0, status.stderr[-3000:]
    shown = json.loads(status.stdout)
    assert [p["state"] for p in shown["partitions"]] == ["Backfilling"] * 3 and shown["source_job"] is None
    assert password not in status.stdout + status.stderr


    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_SASL", env["AIRFLOW_CONN_KAFKA_SASL"])
    sensor = SplitsFinishedSensor(task_id="wait", pipeline=pipeline)
    assert sensor.poke(context_with()) is False  # three partitions, none Finished
    poll = asyncio.run(asyncio.to_thread(SplitsFinishedTrigger(pipeline.to_mapping()).check))
    assert not poll.done and poll.facts["partitions"] == 3
    with pytest.raises(UpstreamError, match="does not exist"):
        from airflow_backfill.kafka.status import split_statuses

        split_statuses(_pipeline("no-such-topic", tmp_path).backfill)
