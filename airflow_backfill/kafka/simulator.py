"""A Kafka producer for tests, the demo and the benchmark: JSON records at per-partition rates.

It remembers every record it produced with its partition and offset, so a test can
compute the oracle (the query over the records at or below an MV's split offsets).
"""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

VALUE_SCHEMA = "id BIGINT, customer STRING, amount DOUBLE, kind STRING"
"""The value schema of the records this simulator produces."""
_KINDS = ("order", "refund", "skip")


@dataclass(frozen=True)
class ProducedRecord:
    partition: int
    offset: int
    key: str
    value: dict[str, Any]


@dataclass
class KafkaSimulator:
    """Creates a topic and produces records of `VALUE_SCHEMA` to chosen partitions."""

    bootstrap_servers: str
    topic: str
    seed: int = 0
    remember: bool = True
    """Keep every produced record in `produced` (tests' oracles); off for long runs."""
    produced: list[ProducedRecord] = field(default_factory=list)
    count: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _next_id: int = 0

    def __post_init__(self) -> None:
        from kafka import KafkaProducer

        self._random = random.Random(self.seed)
        self._producer = KafkaProducer(bootstrap_servers=self.bootstrap_servers, linger_ms=5, acks="all")

    def _admin(self) -> Any:
        from kafka.admin import KafkaAdminClient

        return KafkaAdminClient(bootstrap_servers=self.bootstrap_servers)

    def create_topic(self, partitions: int) -> None:
        admin = self._admin()
        try:
            admin.create_topics({self.topic: {"num_partitions": partitions, "replication_factor": 1}})
        finally:
            admin.close()
        self._wait_partitions(partitions)

    def add_partitions(self, total: int) -> None:
        """Grow the topic to `total` partitions."""
        admin = self._admin()
        try:
            admin.create_partitions({self.topic: total})
        finally:
            admin.close()
        self._wait_partitions(total)

    def _wait_partitions(self, count: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._producer._metadata.request_update()  # noqa: SLF001 - refresh the producer's view of the topic
            partitions = self._producer.partitions_for(self.topic)
            if partitions is not None and len(partitions) >= count:
                return
            time.sleep(0.2)
        raise TimeoutError(f"topic {self.topic} did not reach {count} partitions within {timeout}s")

    def record_value(self) -> tuple[str, dict[str, Any]]:
        with self._lock:
            self._next_id += 1
            ident = self._next_id
        value = {
            "id": ident,
            "customer": f"c{self._random.randrange(50)}",
            "amount": round(self._random.uniform(1, 500), 2),
            "kind": self._random.choice(_KINDS),
        }
        return str(ident), value

    def produce(self, counts: dict[int, int]) -> list[ProducedRecord]:
        """Produce `counts[p]` records to each partition `p` and wait for the broker's acks."""
        futures = []
        for partition, count in counts.items():
            for _ in range(count):
                key, value = self.record_value()
                future = self._producer.send(
                    self.topic, key=key.encode(), value=json.dumps(value).encode(), partition=partition
                )
                futures.append((key, value, future))
        self._producer.flush(timeout=60)
        records = []
        for key, value, future in futures:
            meta = future.get(timeout=60)
            records.append(ProducedRecord(meta.partition, meta.offset, key, value))
        with self._lock:
            self.count += len(records)
            if self.remember:
                self.produced.extend(records)
        return records

    def produce_raw(self, partition: int, value: bytes) -> int:
        """Produce one record with an arbitrary value (e.g. one that is not JSON); its offset."""
        meta = self._producer.send(self.topic, key=b"raw", value=value, partition=partition).get(timeout=60)
        return int(meta.offset)

    def produce_at_rates(self, rates: dict[int, float], duration: float, stop: threading.Event | None = None) -> None:
        """Produce for `duration` seconds at `rates[p]` records per second to each partition."""
        started = time.monotonic()
        sent = dict.fromkeys(rates, 0)
        while time.monotonic() - started < duration and not (stop is not None and stop.is_set()):
            elapsed = time.monotonic() - started
            due = {p: int(rate * elapsed) - sent[p] for p, rate in rates.items()}
            due = {p: n for p, n in due.items() if n > 0}
            if due:
                self.produce(due)
                for p, n in due.items():
                    sent[p] += n
            time.sleep(0.05)

    def delete_before(self, partition: int, offset: int) -> None:
        """Drop the partition's records below `offset`, as retention would."""
        from kafka import TopicPartition

        admin = self._admin()
        try:
            admin.delete_records({TopicPartition(self.topic, partition): offset})
        finally:
            admin.close()

    def close(self) -> None:
        self._producer.close(timeout=10)
