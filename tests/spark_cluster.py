"""A Spark standalone cluster on 127.0.0.1 for tests: one master and one worker started from
the installed pyspark distribution, so executors run in their own JVMs, apart from the
driver, and receive the Delta jars from the driver as a real cluster would."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyspark

from airflow_backfill.loopback import free_port

STARTUP_TIMEOUT = 90.0
WORKER_CORES = 2
WORKER_MEMORY = "3g"


@dataclass(frozen=True)
class SparkCluster:
    master_url: str
    """`spark://127.0.0.1:<port>`: what spark-submit and the Airflow connection point at."""
    web_url: str
    """The master's web UI, whose /json/ endpoint lists workers and applications."""

    def state(self) -> dict:
        with urllib.request.urlopen(f"{self.web_url}/json/", timeout=5) as response:
            return json.load(response)


def _spark_class(*args: str, log: Path, env: dict[str, str]) -> subprocess.Popen:
    spark_home = Path(pyspark.__file__).parent
    command = [str(spark_home / "bin" / "spark-class"), *args]
    return subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)


@contextmanager
def spark_cluster(work_dir: Path) -> Iterator[SparkCluster]:
    """Start a master and a worker on loopback; stop both on exit (bounded waits)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    spark_home = str(Path(pyspark.__file__).parent)
    env = {**os.environ, "SPARK_HOME": spark_home, "SPARK_LOCAL_IP": "127.0.0.1",
           "SPARK_WORKER_DIR": str(work_dir / "worker"), "SPARK_LOG_DIR": str(work_dir)}
    port, web_port, worker_web_port = free_port(), free_port(), free_port()
    cluster = SparkCluster(master_url=f"spark://127.0.0.1:{port}", web_url=f"http://127.0.0.1:{web_port}")
    master = _spark_class("org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                          "--webui-port", str(web_port), log=work_dir / "master.log", env=env)
    worker = None
    try:
        _wait(lambda: _state_if_answering(cluster) is not None, master, work_dir / "master.log", "the Spark master")
        worker = _spark_class(
            "org.apache.spark.deploy.worker.Worker", cluster.master_url, "--host", "127.0.0.1",
            "--cores", str(WORKER_CORES), "--memory", WORKER_MEMORY, "--webui-port", str(worker_web_port),
            log=work_dir / "worker.log", env=env,
        )
        _wait(lambda: bool((_state_if_answering(cluster) or {}).get("aliveworkers")), worker,
              work_dir / "worker.log", "the Spark worker to register")
        yield cluster
    finally:
        for process in (worker, master):
            if process is not None:
                _stop(process)


def _state_if_answering(cluster: SparkCluster) -> dict | None:
    """The master's state, or None while its web UI is not serving it yet: a starting UI
    refuses connections, answers with an error page, or cuts a response short."""
    try:
        return cluster.state()
    except (OSError, ValueError, http.client.HTTPException):
        return None


def _wait(ready, process: subprocess.Popen, log: Path, what: str) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while not ready():
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited ({process.returncode}): {log.read_text()[-2000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {STARTUP_TIMEOUT:.0f}s waiting for {what}: {log.read_text()[-2000:]}")
        time.sleep(0.5)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, 15)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait(timeout=10)
