"""A session-scoped loopback Kafka broker (KRaft) and a fresh topic per test."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from airflow_backfill.kafka.loopback_broker import LoopbackBroker
from airflow_backfill.kafka.simulator import KafkaSimulator

_topics = itertools.count()


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackBroker]:
    broker = LoopbackBroker(str(tmp_path_factory.mktemp("kafka"))).start()
    yield broker
    broker.stop()


@pytest.fixture
def kafka_simulator(kafka_broker: LoopbackBroker) -> Iterator[KafkaSimulator]:
    simulator = KafkaSimulator(kafka_broker.bootstrap_servers, f"orders-{next(_topics)}")
    yield simulator
    simulator.close()
