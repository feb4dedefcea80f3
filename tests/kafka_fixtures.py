"""A session-scoped loopback Kafka broker (KRaft) and a fresh topic per test.

The broker also listens for SASL_PLAINTEXT clients (PLAIN) with one user whose password
is made up per session: tests that reach it through an Airflow connection look for that
password where it must never appear."""

from __future__ import annotations

import itertools
import json
import secrets
from collections.abc import Iterator

import pytest

from airflow_backfill.kafka.loopback_broker import LoopbackBroker
from airflow_backfill.kafka.simulator import KafkaSimulator

_topics = itertools.count()
SASL_USER = "airflow_backfill"


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackBroker]:
    broker = LoopbackBroker(str(tmp_path_factory.mktemp("kafka")), sasl_users={SASL_USER: secrets.token_hex(12)})
    broker.start()
    yield broker
    broker.stop()


def sasl_connection(broker: LoopbackBroker) -> str:
    """An Airflow connection (JSON, as `AIRFLOW_CONN_<ID>` takes it) of the `kafka` type that
    reaches `broker` with SASL_PLAINTEXT and the session's user."""
    return json.dumps({"conn_type": "kafka", "extra": {
        "bootstrap.servers": broker.sasl_bootstrap_servers, "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN", "sasl.username": SASL_USER, "sasl.password": broker.sasl_users[SASL_USER],
    }})


@pytest.fixture
def kafka_simulator(kafka_broker: LoopbackBroker) -> Iterator[KafkaSimulator]:
    simulator = KafkaSimulator(kafka_broker.bootstrap_servers, f"orders-{next(_topics)}")
    yield simulator
    simulator.close()
