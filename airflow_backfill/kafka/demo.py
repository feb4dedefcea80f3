"""`airflow-backfill kafka-demo`: a broker on loopback, a topic, and records arriving at a rate.

The way in for a newcomer: the broker runs from Apache Kafka's jars that the install
fetched (no download), keeps its data under the given folder (a restart keeps the topic
and its records), creates the topic when it is missing and produces JSON records of
`simulator.VALUE_SCHEMA` until stopped.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass

from airflow_backfill.kafka.loopback_broker import LoopbackBroker
from airflow_backfill.kafka.simulator import KafkaSimulator

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DemoSettings:
    workdir: str
    port: int = 9092
    topic: str = "orders"
    partitions: int = 4
    rate: float = 50.0
    """Records per second over all partitions."""
    duration: float | None = None
    """Seconds to produce for (None: until stopped)."""


def connection_line(bootstrap_servers: str, conn_id: str = "kafka_default") -> str:
    """The shell line that defines the Airflow connection of the demo's broker."""
    extra = json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": bootstrap_servers}})
    return f"export AIRFLOW_CONN_{conn_id.upper()}='{extra}'"


def ensure_topic(simulator: KafkaSimulator, partitions: int) -> bool:
    """Create the topic unless it exists; True when it was created."""
    from kafka.errors import TopicAlreadyExistsError

    try:
        simulator.create_topic(partitions)
    except TopicAlreadyExistsError:
        return False
    return True


def run_demo(settings: DemoSettings, stop: threading.Event) -> int:
    """Start the broker, create the topic, produce until `stop` or the duration; the records produced."""
    broker = LoopbackBroker(settings.workdir, port=settings.port).start()
    simulator = KafkaSimulator(broker.bootstrap_servers, settings.topic, seed=int(time.time()), remember=False)
    try:
        created = ensure_topic(simulator, settings.partitions)
        partitions = sorted(simulator._producer.partitions_for(settings.topic) or [])  # noqa: SLF001
        print(f"Kafka broker on {broker.bootstrap_servers} (data in {settings.workdir}); topic "
              f"{settings.topic!r} with {len(partitions)} partitions {'created' if created else 'found'}; "
              f"producing {settings.rate:g} records/s. Ctrl-C stops.", flush=True)
        print(f"The Airflow connection of this broker: {connection_line(broker.bootstrap_servers)}", flush=True)
        rates = {p: settings.rate / len(partitions) for p in partitions}
        duration = settings.duration if settings.duration is not None else float("inf")
        simulator.produce_at_rates(rates, duration, stop)
        print(f"produced {simulator.count} records to {settings.topic!r}", flush=True)
        return simulator.count
    finally:
        simulator.close()
        broker.stop()
