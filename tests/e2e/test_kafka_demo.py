"""`airflow-backfill kafka-demo`, as docs/kafka.md has a newcomer run it: a broker on
loopback from the installed jars, the topic created, records produced at a rate; a second
start finds the topic and its records again."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_backfill.loopback import free_port

pytestmark = pytest.mark.e2e

CLI = str(Path(sys.executable).with_name("airflow-backfill"))


def demo(workdir: Path, port: int, *extra: str) -> str:
    finished = subprocess.run(
        [CLI, "kafka-demo", "--workdir", str(workdir), "--port", str(port), "--rate", "200", "--duration", "3",
         *extra], capture_output=True, text=True, timeout=180, check=False)
    assert finished.returncode == 0, finished.stdout[-2000:] + finished.stderr[-2000:]
    return finished.stdout


def test_the_demo_starts_a_broker_creates_the_topic_and_produces_at_a_rate(tmp_path):
    port = free_port()
    first = demo(tmp_path / "broker", port, "--partitions", "2")
    assert f"Kafka broker on 127.0.0.1:{port}" in first and "with 2 partitions created" in first
    assert "export AIRFLOW_CONN_KAFKA_DEFAULT='{\"conn_type\": \"kafka\", \"extra\": " in first
    produced = int(re.search(r"produced (\d+) records to 'orders'", first).group(1))
    assert 300 <= produced <= 700, first  # about 200 records/s for 3 s

    again = demo(tmp_path / "broker", port)
    assert "with 2 partitions found" in again  # the data folder kept the topic
