"""A topic's partitions and their offset ranges, asked of the brokers (no Spark).

Offsets here follow Kafka: `earliest` is the oldest offset the partition still holds,
`end` the offset the next record will get, so the records present are `[earliest, end)`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_backfill.exceptions import (
    AccessDeniedError,
    ServiceError,
    UnreachableError,
    UpstreamError,
)

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


PROBE_TIMEOUT_S = 5.0
"""How long `bootstrap_failure` waits for each broker's TCP connection."""


def bootstrap_failure(brokers: KafkaSettings, error: Exception, timeout: float) -> ServiceError:
    """Why the client could not reach the brokers, told by connecting to each one again.

    kafka-python reports only that it could not bootstrap in time, whatever happened (its
    logs, silenced here, say more). Brokers that take no TCP connection are a network or
    address failure; brokers that take one but never complete the client's handshake
    refused its SASL login or speak another security.protocol.
    """
    quoted = f"{type(error).__name__}: {error}"
    where = f"connection {brokers.conn_id!r}" if brokers.conn_id else "the job's bootstrap_servers"
    servers = brokers.bootstrap_servers.split(",")
    failures = [f"{server}: {reason}" for server in servers
                if (reason := _connect_failure(server, min(timeout, PROBE_TIMEOUT_S))) is not None]
    if len(failures) == len(servers):
        return UnreachableError(
            f"cannot reach any Kafka broker of {where}: {'; '.join(failures)}. Check bootstrap.servers and that "
            f"the brokers run and are reachable from this host. ({quoted})"
        )
    if brokers.protocol.startswith("SASL"):
        return AccessDeniedError(
            f"the Kafka brokers {brokers.bootstrap_servers} take connections but closed every one during the "
            f"client's handshake for {timeout:.0f} s: they refused the SASL login (check sasl.username, "
            f"sasl.password and sasl.mechanism {brokers.mechanism} of {where}), or that listener speaks another "
            f"security.protocol than {brokers.protocol}. ({quoted})"
        )
    return ServiceError(
        f"the Kafka brokers {brokers.bootstrap_servers} take connections but the client's handshake did not "
        f"complete for {timeout:.0f} s: that listener most likely speaks another security.protocol than "
        f"{brokers.protocol} (SSL or SASL_*: set it in {where}). ({quoted})"
    )


def _connect_failure(server: str, timeout: float) -> str | None:
    """What stops a TCP connection to `server` (host:port); None when it connects."""
    import socket

    host, _, port = server.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return None
    except socket.gaierror as error:
        return f"the host name does not resolve ({error})"
    except ConnectionRefusedError:
        return "the connection was refused (nothing listens on that port)"
    except TimeoutError:
        return f"no answer within {timeout:.0f} s"
    except OSError as error:
        return f"the connection failed ({error})"


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
            bootstrap_timeout_ms=int(timeout * 1000),
            reconnect_backoff_max_ms=1000,
        )
    except KafkaError as error:
        raise bootstrap_failure(brokers, error, timeout) from error
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
