"""A real `airflow api-server` on a free loopback port, with Airflow's simple auth manager
(users `viewer` and `editor`), eager provider discovery (so the provider's plugin is
mounted) and a DAG folder declaring two backfill jobs. One server for the session: it
takes seconds to start."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
PASSWORDS = {"viewer": "viewer-secret", "editor": "editor-secret"}
STARTUP_SECONDS = 180
API_JOB = "api_orders_mv"
BROWSER_JOB = "browser_orders_mv"
DAG_ID = "plugin_test_backfill"

RATE_LIMITS = {API_JOB: 500, BROWSER_JOB: 20}

DAG_FILE = '''
import pendulum
from airflow.sdk import DAG

from airflow_backfill.task_group import backfill_task_group

with DAG("{dag_id}", schedule=None, start_date=pendulum.datetime(2026, 1, 1)):
    backfill_task_group({api_job!r}, group_id="api")
    backfill_task_group({browser_job!r}, group_id="browser")
'''


def job_spec(name: str, root: Path) -> dict:
    """The job a test DAG declares (the tests build the same job to run its phases)."""
    return {
        "name": name, "source": str(root / f"{name}_source"), "target": str(root / name),
        "query": "SELECT order_id, amount FROM source", "primary_key": ["order_id"],
        "backfill_parallelism": 2, "parallelism": 1, "rate_limit": RATE_LIMITS[name],
    }


@dataclass(frozen=True)
class ApiServer:
    url: str
    tables: Path
    """Where the DAG's jobs keep their upstreams and MVs."""

    def token(self, user: str) -> str:
        response = httpx.post(f"{self.url}/auth/token", json={"username": user, "password": PASSWORDS[user]},
                              timeout=30)
        response.raise_for_status()
        return response.json()["access_token"]

    def client(self, user: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.token(user)}"} if user else {}
        return httpx.Client(base_url=f"{self.url}/airflow-backfill", headers=headers, timeout=60)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_until_up(url: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"airflow api-server exited with {process.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(f"{url}/api/v2/monitor/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"airflow api-server not up after {STARTUP_SECONDS}s:\n{log.read_text()[-4000:]}")


def run_api_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    home = tmp_path_factory.mktemp("airflow_home")
    tables = tmp_path_factory.mktemp("plugin_tables")
    dags = home / "dags"
    dags.mkdir()
    (dags / "plugin_test_dag.py").write_text(textwrap.dedent(DAG_FILE.format(
        dag_id=DAG_ID, api_job=job_spec(API_JOB, tables), browser_job=job_spec(BROWSER_JOB, tables))))
    passwords = home / "passwords.json"
    passwords.write_text(json.dumps(PASSWORDS))
    database = home / "airflow.db"
    migrated = ROOT / ".airflow" / "airflow.db"  # `scripts/install.sh` migrated it; copying is faster
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS": "False",
        "AIRFLOW__CORE__AUTH_MANAGER":
            "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "viewer:viewer,editor:user",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{database}",
        "AIRFLOW__API__BASE_URL": url,
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(16),
        "AIRFLOW__API__SECRET_KEY": secrets.token_hex(16),
    }
    airflow = [sys.executable, "-m", "airflow"]
    if migrated.exists():
        shutil.copy(migrated, database)
    else:
        subprocess.run([*airflow, "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)
    log = home / "api-server.log"
    with open(log, "w") as output:
        process = subprocess.Popen(
            [*airflow, "api-server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
            env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        _wait_until_up(url, process, log)
        yield ApiServer(url=url, tables=tables)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
