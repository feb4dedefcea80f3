"""A real `airflow api-server` on a free loopback port, with Airflow's simple auth manager
(users `viewer` and `editor`), eager provider discovery (so the provider's plugin is
mounted) and a DAG folder of many DAG files: one declares two backfill jobs, one is the
example DAG, the others are plain DAGs. The DAGs are serialized to the metadata database
before the server starts (`airflow dags reserialize`, as the DAG processor would), and
every DAG file records its import in `imports.log` when the API server's process imports
it: the tests assert that it never does. One server for the session: it takes seconds to
start."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from airflow_processes import (
    ROOT,
    airflow_env,
    prepare_database,
    run_airflow,
    start,
    stop,
    wait_until_healthy,
)

from airflow_backfill.loopback import free_port

PASSWORDS = {"viewer": "viewer-secret", "editor": "editor-secret"}
API_JOB = "api_orders_mv"
BROWSER_JOB = "browser_orders_mv"
DAG_ID = "plugin_test_backfill"
EXAMPLE_DAG_ID = "example_orders_mv"
PLAIN_DAG_FILES = 40
"""DAG files without a backfill job: the plugin's requests must not cost more with more of them."""

RATE_LIMITS = {API_JOB: 500, BROWSER_JOB: 20}

IMPORT_GUARD = '''
import os as _os
if _os.environ.get("PLUGIN_TEST_API_SERVER"):
    with open(_os.environ["PLUGIN_TEST_IMPORTS_LOG"], "a") as _log:
        _log.write(f"{_os.getpid()} {__file__}\\n")
    raise RuntimeError("DAG code must not run in the API server")
'''
"""Prepended to every DAG file: an import by the API server is recorded and fails."""

DAG_FILE = '''
import pendulum
from airflow.sdk import DAG

from airflow_backfill.task_group import backfill_task_group

with DAG("{dag_id}", schedule=None, start_date=pendulum.datetime(2026, 1, 1)):
    backfill_task_group({api_job!r}, group_id="api")
    backfill_task_group({browser_job!r}, group_id="browser")
'''

PLAIN_DAG_FILE = '''
import pendulum
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG

with DAG("plain_{index:03d}", schedule=None, start_date=pendulum.datetime(2026, 1, 1)):
    EmptyOperator(task_id="nothing")
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
    imports_log: Path
    """DAG files the API server's process imported (one line each; none expected)."""
    pid: int

    def token(self, user: str) -> str:
        response = httpx.post(f"{self.url}/auth/token", json={"username": user, "password": PASSWORDS[user]},
                              timeout=30)
        response.raise_for_status()
        return response.json()["access_token"]

    def client(self, user: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.token(user)}"} if user else {}
        return httpx.Client(base_url=f"{self.url}/airflow-backfill", headers=headers, timeout=60)

    def dag_imports(self) -> list[str]:
        return self.imports_log.read_text().splitlines() if self.imports_log.exists() else []


def write_dag_folder(dags: Path, tables: Path) -> None:
    dags.mkdir()
    (dags / "plugin_test_dag.py").write_text(IMPORT_GUARD + textwrap.dedent(DAG_FILE.format(
        dag_id=DAG_ID, api_job=job_spec(API_JOB, tables), browser_job=job_spec(BROWSER_JOB, tables))))
    (dags / "example_orders_mv.py").write_text(
        IMPORT_GUARD + (ROOT / "dags" / "example_orders_mv.py").read_text().replace(
            "from __future__ import annotations\n", ""))
    for index in range(PLAIN_DAG_FILES):
        (dags / f"plain_{index:03d}.py").write_text(IMPORT_GUARD + PLAIN_DAG_FILE.format(index=index))


def run_api_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    home = tmp_path_factory.mktemp("airflow_home")
    tables = tmp_path_factory.mktemp("plugin_tables")
    dags = home / "dags"
    write_dag_folder(dags, tables)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**airflow_env(home, dags, url, PASSWORDS, {"viewer": "viewer", "editor": "user"}),
           "AIRFLOW_BACKFILL_HOME": str(tables / "example")}
    prepare_database(home / "airflow.db", env)
    serialized = run_airflow("dags", "reserialize", env=env, timeout=300)
    assert serialized.returncode == 0, serialized.stdout + serialized.stderr
    imports_log = home / "imports.log"
    log = home / "api-server.log"
    server_env = {**env, "PLUGIN_TEST_API_SERVER": "1", "PLUGIN_TEST_IMPORTS_LOG": str(imports_log)}
    process = start(["api-server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"], server_env, log)
    try:
        wait_until_healthy(f"{url}/api/v2/monitor/health", {"api-server": (process, log)})
        yield ApiServer(url=url, tables=tables, imports_log=imports_log, pid=process.pid)
    finally:
        stop([process])
