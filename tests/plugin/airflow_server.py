"""A real `airflow api-server` on a free loopback port, with Airflow's simple auth manager
(users `viewer` and `editor`), eager provider discovery (so the provider's plugin is
mounted) and a DAG folder declaring two backfill jobs. One server for the session: it
takes seconds to start."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from airflow_processes import airflow_env, prepare_database, start, stop, wait_until_healthy

from airflow_backfill.loopback import free_port

PASSWORDS = {"viewer": "viewer-secret", "editor": "editor-secret"}
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


def run_api_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    home = tmp_path_factory.mktemp("airflow_home")
    tables = tmp_path_factory.mktemp("plugin_tables")
    dags = home / "dags"
    dags.mkdir()
    (dags / "plugin_test_dag.py").write_text(textwrap.dedent(DAG_FILE.format(
        dag_id=DAG_ID, api_job=job_spec(API_JOB, tables), browser_job=job_spec(BROWSER_JOB, tables))))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**airflow_env(home, dags, url, PASSWORDS, {"viewer": "viewer", "editor": "user"}),
           "AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS": "False"}
    prepare_database(home / "airflow.db", env)
    log = home / "api-server.log"
    process = start(["api-server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"], env, log)
    try:
        wait_until_healthy(f"{url}/api/v2/monitor/health", {"api-server": (process, log)})
        yield ApiServer(url=url, tables=tables)
    finally:
        stop([process])
