"""A single-node Kafka broker (KRaft mode) on 127.0.0.1, for tests, the demo and the benchmark.

Runs Apache Kafka's own jars (fetched by `airflow-backfill jars fetch --kafka-broker` into
the provider's cache, or the folder `[airflow_backfill] kafka_broker_jars` names) with the JDK, on free ports picked at start, with its logs in a folder the caller owns.
Every wait is bounded; `stop()` ends only the process it started.
"""

from __future__ import annotations

import base64
import logging
import os
import subprocess
import time
import uuid
from dataclasses import dataclass, field

from airflow_backfill.exceptions import BackfillConfigError
from airflow_backfill.jvm.libraries import KAFKA_BROKER
from airflow_backfill.loopback import free_port

log = logging.getLogger(__name__)

def broker_classpath() -> str:
    """The broker's classpath; a clear error naming the command that fetches it."""
    directory = KAFKA_BROKER.folder()
    if directory is None or not KAFKA_BROKER.present():
        raise BackfillConfigError(KAFKA_BROKER.missing_message())
    return os.path.join(directory, "*")


def _server_properties(
    log_dirs: str, port: int, controller_port: int, sasl_port: int = 0, sasl_users: dict[str, str] | None = None,
) -> str:
    listeners = [f"PLAINTEXT://127.0.0.1:{port}"]
    sasl: list[str] = []
    if sasl_users:
        listeners.append(f"SASL_PLAINTEXT://127.0.0.1:{sasl_port}")
        users = " ".join(f'user_{name}="{password}"' for name, password in sorted(sasl_users.items()))
        sasl = [
            "sasl.enabled.mechanisms=PLAIN",
            "listener.name.sasl_plaintext.sasl.enabled.mechanisms=PLAIN",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config="
            f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};",
        ]
    return "\n".join([
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.voters=1@127.0.0.1:{controller_port}",
        f"listeners={','.join(listeners)},CONTROLLER://127.0.0.1:{controller_port}",
        f"advertised.listeners={','.join(listeners)}",
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=PLAINTEXT",
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
        *sasl,
        f"log.dirs={log_dirs}",
        "num.partitions=1",
        "auto.create.topics.enable=false",
        "offsets.topic.replication.factor=1",
        "offsets.topic.num.partitions=1",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "share.coordinator.state.topic.replication.factor=1",
        "share.coordinator.state.topic.min.isr=1",
        "group.initial.rebalance.delay.ms=0",
        "",
    ])


def _cluster_id() -> str:
    """A random KRaft cluster id. Kafka's own never starts with "-": the storage tool would
    read such an id as an option and refuse to format (one start in 64 would fail)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def _existing_cluster_id(log_dirs: str) -> str | None:
    """The cluster id of a broker that already ran in `log_dirs` (it restarts with its topics)."""
    try:
        with open(os.path.join(log_dirs, "meta.properties"), encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("cluster.id="):
                    return line.strip().split("=", 1)[1]
    except FileNotFoundError:
        return None
    return None


@dataclass
class LoopbackBroker:
    """One broker process; `bootstrap_servers` is what clients and Spark connect to.

    `port` 0 picks a free one. With `sasl_users` (name -> password) the broker also
    listens for SASL_PLAINTEXT clients (mechanism PLAIN) on `sasl_bootstrap_servers`.
    """

    workdir: str
    heap: str = "512m"
    port: int = 0
    sasl_users: dict[str, str] = field(default_factory=dict, repr=False)
    sasl_port: int = 0
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def sasl_bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.sasl_port}"

    def start(self, timeout: float = 90.0) -> LoopbackBroker:
        """Format the KRaft storage, start the broker and wait (bounded) until it answers."""
        classpath = broker_classpath()
        os.makedirs(self.workdir, exist_ok=True)
        self.port = self.port or free_port()
        self.sasl_port = (self.sasl_port or free_port()) if self.sasl_users else 0
        controller_port = free_port()
        properties = os.path.join(self.workdir, "server.properties")
        with open(properties, "w", encoding="utf-8") as handle:
            handle.write(_server_properties(os.path.join(self.workdir, "data"), self.port, controller_port,
                                            self.sasl_port, self.sasl_users))
        java = ["java", f"-Xmx{self.heap}", "-Xms128m", "-cp", classpath]
        cluster_id = _existing_cluster_id(os.path.join(self.workdir, "data")) or _cluster_id()
        subprocess.run(
            [*java, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", properties, "--ignore-formatted"],
            check=True, capture_output=True, timeout=timeout,
        )
        output = open(os.path.join(self.workdir, "broker.log"), "wb")  # noqa: SIM115 - the broker's lifetime
        self.process = subprocess.Popen(
            [*java, "-Dslf4j.internal.verbosity=WARN", "kafka.Kafka", properties],
            stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
        )
        output.close()
        self._wait_ready(timeout)
        log.info("kafka broker up on %s (pid %s)", self.bootstrap_servers, self.process.pid)
        return self

    def _wait_ready(self, timeout: float) -> None:
        from kafka.admin import KafkaAdminClient

        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"the Kafka broker exited with {self.process.returncode}; see {self.workdir}/broker.log")
            try:
                admin = KafkaAdminClient(
                    bootstrap_servers=self.bootstrap_servers, request_timeout_ms=5000, reconnect_backoff_max_ms=500,
                )
                try:
                    admin.list_topics()
                    return
                finally:
                    admin.close()
            except Exception as error:  # the broker is still starting
                last_error = error
                time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"the Kafka broker did not answer within {timeout:.0f}s: {last_error}")

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the broker this object started (SIGTERM, then SIGKILL after `timeout`)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=timeout)
