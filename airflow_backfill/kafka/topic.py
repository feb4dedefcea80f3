"""A Kafka topic as a job declares it: brokers, topic name and the JSON value's schema.

The lowest Kafka module: the job declarations (`config`), the broker settings
(`connection`) and the record reader (`records`) all stand on it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from airflow_backfill.exceptions import BackfillConfigError

BOOTSTRAP = re.compile(r"^[A-Za-z0-9.-]+:\d{1,5}(,[A-Za-z0-9.-]+:\d{1,5})*$")
"""`host:port[,host:port...]`."""
NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,127}$")
"""Job and connection names."""
TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
RECORD_COLUMNS = ("key", "_partition", "_offset", "_timestamp")
"""Columns every decoded record has besides the fields of its value."""


@dataclass(frozen=True)
class KafkaTopic:
    """A Kafka topic whose record values are JSON objects of a declared schema."""

    bootstrap_servers: str | None
    """`host:port[,host:port...]` of the brokers, for brokers reached without a connection."""
    topic: str
    """The topic's name."""
    value_schema: str
    """The value's fields as a Spark DDL string, e.g. `order_id BIGINT, amount DOUBLE`."""
    kafka_conn_id: str | None = None
    """An Airflow connection of the `kafka` type (brokers and client settings, SASL/SSL
    secrets included, in its extra); instead of `bootstrap_servers`."""

    def __post_init__(self) -> None:
        if (self.bootstrap_servers is None) == (self.kafka_conn_id is None):
            raise BackfillConfigError(
                "name the brokers with either bootstrap_servers ('host:port') or kafka_conn_id (an Airflow "
                f"connection of the kafka type), not {'both' if self.kafka_conn_id else 'neither'}."
            )
        if self.kafka_conn_id is not None and (not isinstance(self.kafka_conn_id, str) or not NAME.match(
                self.kafka_conn_id)):
            raise BackfillConfigError(f"kafka_conn_id must be an Airflow connection id, got {self.kafka_conn_id!r}.")
        if self.bootstrap_servers is not None and (
                not isinstance(self.bootstrap_servers, str) or not BOOTSTRAP.match(self.bootstrap_servers)):
            raise BackfillConfigError(
                f"bootstrap_servers must be 'host:port' (comma-separated for several), got {self.bootstrap_servers!r}."
            )
        if not isinstance(self.topic, str) or not TOPIC_NAME.match(self.topic):
            raise BackfillConfigError(f"topic must be a Kafka topic name (letters, digits, '._-'), got {self.topic!r}.")
        if not isinstance(self.value_schema, str) or not self.value_schema.strip():
            raise BackfillConfigError(
                "value_schema must declare the value's JSON fields as Spark DDL, e.g. 'order_id BIGINT, amount DOUBLE'."
            )
        clashes = [name for name in RECORD_COLUMNS if re.search(rf"(^|,)\s*`?{name}`?\s", self.value_schema)]
        if clashes:
            raise BackfillConfigError(
                f"value_schema declares {', '.join(clashes)}, which every record already has; rename the field."
            )
