"""A topic's partitions and their offset ranges, asked of the brokers (no Spark).

Offsets here follow Kafka: `earliest` is the oldest offset the partition still holds,
`end` the offset the next record will get, so the records present are `[earliest, end)`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_backfill.exceptions import UpstreamError

if TYPE_CHECKING:
    from airflow_backfill.kafka.connection import KafkaSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PartitionRange:
    """The offsets a partition holds right now."""

    earliest: int
    end: int


def quiet_kafka_client() -> None:
    """kafka-python logs every failed connection attempt (several a second while a broker is
    unreachable); the callers report a failure once, with what to check."""
    logging.getLogger("kafka").setLevel(logging.CRITICAL)


def topic_ranges(brokers: KafkaSettings, topic: str, timeout: float = 30.0) -> dict[int, PartitionRange]:
    """Every partition of `topic` with its `[earliest, end)` range; a clear error when the topic is missing."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.errors import KafkaError

    quiet_kafka_client()
    bootstrap_servers = brokers.bootstrap_servers
    try:
        consumer = KafkaConsumer(
            **brokers.client_kwargs(),
            enable_auto_commit=False,
            request_timeout_ms=int(timeout * 1000),
            reconnect_backoff_max_ms=1000,
        )
    except KafkaError as error:
        raise UpstreamError(
            f"cannot reach the Kafka brokers {bootstrap_servers} ({error}); check the brokers' address, the client settings (security.protocol, credentials) and that the brokers run."
        ) from None
    try:
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            raise UpstreamError(
                f"Kafka topic {topic!r} does not exist on {bootstrap_servers}; create it or fix `topic` in the job (a broker that refuses the client's credentials "
                "also lists no topics)."
            )
        parts = [TopicPartition(topic, p) for p in sorted(partitions)]
        earliest = consumer.beginning_offsets(parts)
        end = consumer.end_offsets(parts)
    finally:
        consumer.close()
    return {tp.partition: PartitionRange(int(earliest[tp]), int(end[tp])) for tp in parts}
