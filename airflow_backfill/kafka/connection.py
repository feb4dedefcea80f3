"""How to reach a topic's brokers, and the one channel their secrets travel on.

A job names its brokers either by `bootstrap_servers` or by `kafka_conn_id`, an Airflow
connection laid out as the Apache Kafka provider's `kafka` type: the client settings in
its extra, librdkafka's names (`bootstrap.servers`, `security.protocol`,
`sasl.mechanism`, `sasl.username`, `sasl.password`, `ssl.ca.location`, ...). The
provider itself is not needed to read it.

The Airflow side (operators, sensor, trigger, CLI, UI) reads the connection. The
operators hand it to `spark-submit` as one environment variable, never on a command line,
and mask its secrets in the task log; the Spark driver reads it back and gives it to the
Kafka client (kafka-python) and to Spark's Kafka source (`kafka.*` options, which Spark
ships to the executors inside the job and redacts in its plans and logs).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_backfill.exceptions import AccessDeniedError, BackfillConfigError
from airflow_backfill.kafka.topic import BOOTSTRAP

if TYPE_CHECKING:
    from airflow_backfill.kafka.topic import KafkaTopic

ENVIRONMENT = "AIRFLOW_BACKFILL_KAFKA_SETTINGS"
"""The variable the operators give spark-submit: the connection's settings as JSON."""
CONNECTION_TYPE = "kafka"
_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_MECHANISMS = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
SUPPORTED = (
    "bootstrap.servers", "security.protocol", "sasl.mechanism", "sasl.mechanisms", "sasl.username",
    "sasl.password", "ssl.ca.location", "ssl.certificate.location", "ssl.key.location", "ssl.key.password",
    "ssl.endpoint.identification.algorithm", "client.id",
)
IGNORED = ("group.id", "enable.auto.commit", "auto.offset.reset", "session.timeout.ms")
"""Consumer-group settings a shared connection may carry: the backfill assigns partitions
and offsets itself and never commits to a group, so they do not apply."""
_SECRET_KEYS = ("sasl.password", "ssl.key.password")


@dataclass(frozen=True)
class KafkaSettings:
    """Brokers and client settings (librdkafka names). `repr` never shows a secret."""

    bootstrap_servers: str
    client: dict[str, str] = field(default_factory=dict)
    """Every other setting, validated: see `SUPPORTED`."""
    conn_id: str | None = None

    def __post_init__(self) -> None:
        origin = f"connection {self.conn_id!r}" if self.conn_id else "the job"
        if not isinstance(self.bootstrap_servers, str) or not BOOTSTRAP.match(self.bootstrap_servers):
            raise BackfillConfigError(
                f"{origin}: bootstrap.servers must be 'host:port' (comma-separated for several), "
                f"got {self.bootstrap_servers!r}."
            )
        unknown = sorted(set(self.client) - set(SUPPORTED) - set(IGNORED))
        if unknown:
            raise BackfillConfigError(
                f"{origin}: unsupported Kafka client setting(s) {', '.join(unknown)}; supported: "
                f"{', '.join(SUPPORTED)} (and {', '.join(IGNORED)}, which are ignored)."
            )
        protocol = self.protocol
        if protocol not in _PROTOCOLS:
            raise BackfillConfigError(f"{origin}: security.protocol must be one of {', '.join(_PROTOCOLS)}, "
                                      f"got {protocol!r}.")
        if protocol.startswith("SASL"):
            if self.mechanism not in _MECHANISMS:
                raise BackfillConfigError(f"{origin}: sasl.mechanism must be one of {', '.join(_MECHANISMS)} "
                                          f"with security.protocol {protocol}, got {self.mechanism!r}.")
            if not self.client.get("sasl.username") or not self.client.get("sasl.password"):
                raise BackfillConfigError(f"{origin}: security.protocol {protocol} needs sasl.username and "
                                          "sasl.password in the connection's extra.")
        verify = self.client.get("ssl.endpoint.identification.algorithm", "https")
        if verify not in ("https", "none", ""):
            raise BackfillConfigError(f"{origin}: ssl.endpoint.identification.algorithm must be 'https' or "
                                      f"'none', got {verify!r}.")

    def __repr__(self) -> str:
        shown = {key: ("***" if key in _SECRET_KEYS else value) for key, value in sorted(self.client.items())}
        return f"KafkaSettings(bootstrap_servers={self.bootstrap_servers!r}, client={shown}, conn_id={self.conn_id!r})"

    @property
    def protocol(self) -> str:
        return self.client.get("security.protocol", "PLAINTEXT").upper()

    @property
    def mechanism(self) -> str:
        return (self.client.get("sasl.mechanism") or self.client.get("sasl.mechanisms") or "").upper()

    def secrets(self) -> list[str]:
        """Values that must be masked wherever they could be printed."""
        return [self.client[key] for key in _SECRET_KEYS if self.client.get(key)]

    def to_json(self) -> str:
        return json.dumps({"bootstrap.servers": self.bootstrap_servers, **self.client, "conn_id": self.conn_id})

    @classmethod
    def from_extra(cls, extra: dict[str, Any], conn_id: str | None) -> KafkaSettings:
        """From a `kafka` connection's extra (or what `to_json` wrote)."""
        values = {str(key): value for key, value in extra.items() if key != "conn_id"}
        bootstrap = values.pop("bootstrap.servers", None)
        if not bootstrap:
            raise BackfillConfigError(
                f"connection {conn_id!r} has no bootstrap.servers in its extra; a `kafka` connection keeps "
                "the client settings there, e.g. --conn-extra '{\"bootstrap.servers\": \"host:9092\"}'."
            )
        return cls(str(bootstrap), {key: str(value) for key, value in values.items() if key not in IGNORED},
                   conn_id)

    def client_kwargs(self) -> dict[str, Any]:
        """Arguments of kafka-python's clients (consumer, admin, producer)."""
        kwargs: dict[str, Any] = {"bootstrap_servers": self.bootstrap_servers.split(","),
                                  "security_protocol": self.protocol}
        if self.protocol.startswith("SASL"):
            kwargs.update(sasl_mechanism=self.mechanism, sasl_plain_username=self.client["sasl.username"],
                          sasl_plain_password=self.client["sasl.password"])
        renamed = {"ssl.ca.location": "ssl_cafile", "ssl.certificate.location": "ssl_certfile",
                   "ssl.key.location": "ssl_keyfile", "ssl.key.password": "ssl_password", "client.id": "client_id"}
        kwargs.update({name: self.client[key] for key, name in renamed.items() if self.client.get(key)})
        if self.client.get("ssl.endpoint.identification.algorithm") in ("none", ""):
            kwargs["ssl_check_hostname"] = False
        return kwargs

    def spark_options(self) -> dict[str, str]:
        """Options of Spark's Kafka source (`kafka.` + the Java client's names). Certificates
        and keys travel as PEM text rather than paths, so executors need no files of their own."""
        options = {"kafka.bootstrap.servers": self.bootstrap_servers, "kafka.security.protocol": self.protocol}
        if self.protocol.startswith("SASL"):
            username, password = (_jaas_quote(self.client[key]) for key in ("sasl.username", "sasl.password"))
            options["kafka.sasl.mechanism"] = self.mechanism
            options["kafka.sasl.jaas.config"] = (
                f'{_MECHANISMS[self.mechanism]} required username="{username}" password="{password}";'
            )
        if self.protocol.endswith("SSL"):
            if self.client.get("ssl.ca.location"):
                options["kafka.ssl.truststore.type"] = "PEM"
                options["kafka.ssl.truststore.certificates"] = _read(self.client["ssl.ca.location"])
            if self.client.get("ssl.certificate.location") and self.client.get("ssl.key.location"):
                options["kafka.ssl.keystore.type"] = "PEM"
                options["kafka.ssl.keystore.certificate.chain"] = _read(self.client["ssl.certificate.location"])
                options["kafka.ssl.keystore.key"] = _read(self.client["ssl.key.location"])
                if self.client.get("ssl.key.password"):
                    options["kafka.ssl.key.password"] = self.client["ssl.key.password"]
            if self.client.get("ssl.endpoint.identification.algorithm") in ("none", ""):
                options["kafka.ssl.endpoint.identification.algorithm"] = ""
        if self.client.get("client.id"):
            options["kafka.client.id"] = self.client["client.id"]
        return options


def _jaas_quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError as error:
        raise BackfillConfigError(f"cannot read {path} named by the Kafka connection: {error}") from None


def settings_from_connection(conn_id: str) -> KafkaSettings:
    """The settings of Airflow connection `conn_id` (of the `kafka` type)."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException, AirflowSecretsBackendAccessDenied

    try:
        connection = BaseHook.get_connection(conn_id)
    except AirflowSecretsBackendAccessDenied as error:
        raise AccessDeniedError(
            f"the secrets backend refused this process the job's kafka_conn_id connection {conn_id!r} ({error}); "
            "allow the workers and the triggerer to read it, or name another connection."
        ) from error
    except AirflowNotFoundException:
        raise BackfillConfigError(
            f"the job's kafka_conn_id {conn_id!r} is not an Airflow connection; create it, e.g. "
            f"`airflow connections add {conn_id} --conn-type kafka --conn-extra "
            "'{\"bootstrap.servers\": \"127.0.0.1:9092\"}'`, or define AIRFLOW_CONN_"
            f"{conn_id.upper()}."
        ) from None
    except Exception as error:
        error.add_note(f"(reading the job's kafka_conn_id connection {conn_id!r})")
        raise
    if connection.conn_type and connection.conn_type != CONNECTION_TYPE:
        raise BackfillConfigError(
            f"connection {conn_id!r} is of type {connection.conn_type!r}; kafka_conn_id needs a "
            f"{CONNECTION_TYPE!r} connection with the client settings in its extra."
        )
    return KafkaSettings.from_extra(connection.extra_dejson or {}, conn_id)


def settings_from_environment(conn_id: str) -> KafkaSettings | None:
    """What the operator handed this process for `conn_id` (None when it handed nothing)."""
    text = os.environ.get(ENVIRONMENT)
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        raise BackfillConfigError(f"{ENVIRONMENT} is not JSON; it is set by the Kafka operators.") from None
    if data.get("conn_id") != conn_id:
        return None
    return KafkaSettings.from_extra(data, conn_id)


def broker_settings(upstream: KafkaTopic) -> KafkaSettings:
    """How this process reaches `upstream`'s brokers: its `bootstrap_servers`, or its
    connection as handed down by the operator, or as Airflow resolves it here."""
    if not upstream.kafka_conn_id:
        assert upstream.bootstrap_servers is not None
        return KafkaSettings(upstream.bootstrap_servers)
    handed = settings_from_environment(upstream.kafka_conn_id)
    return handed if handed is not None else settings_from_connection(upstream.kafka_conn_id)
