"""Airflow's own processes for tests: an Airflow home with a migrated SQLite database,
the CLI, and long-running components (`api-server`, `scheduler`, `dag-processor`,
`triggerer`) started in their own process groups on loopback, waited for with a
deadline and stopped at the end."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
STARTUP_SECONDS = 180


def airflow_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "airflow", *args]


def run_airflow(*args: str, env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess:
    """One Airflow CLI command to its end, its output captured."""
    return subprocess.run(airflow_command(*args), env=env, capture_output=True, text=True, timeout=timeout)


def airflow_env(home: Path, dags: Path, url: str, passwords: dict[str, str], roles: dict[str, str]) -> dict[str, str]:
    """The environment of an Airflow home: its DAG folder, its SQLite database, the API
    server at `url` with the simple auth manager (`roles`: user -> role, `passwords`:
    user -> password) and secrets shared by every component started with it."""
    passwords_file = home / "passwords.json"
    passwords_file.write_text(json.dumps(passwords))
    return {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__AUTH_MANAGER":
            "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{user}:{role}" for user, role in roles.items()),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords_file),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__API__BASE_URL": url,
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(16),
        "AIRFLOW__API__SECRET_KEY": secrets.token_hex(16),
    }


def prepare_database(database: Path, env: dict[str, str]) -> None:
    """A migrated SQLite database at `database`: a copy of the one `scripts/install.sh`
    migrated (seconds faster), else migrated here."""
    migrated = ROOT / ".airflow" / "airflow.db"
    if migrated.exists():
        shutil.copy(migrated, database)
    else:
        subprocess.run(airflow_command("db", "migrate"), env=env, check=True, capture_output=True, timeout=300)


def start(args: Sequence[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """An Airflow component in its own process group, its output in `log`."""
    with open(log, "w") as output:
        return subprocess.Popen(airflow_command(*args), env=env, stdout=output, stderr=subprocess.STDOUT,
                                start_new_session=True)


def wait_until_healthy(url: str, processes: dict[str, tuple[subprocess.Popen, Path]]) -> None:
    """Until `url` answers 200; an error with the log of any component that exited first."""
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        for name, (process, log) in processes.items():
            if process.poll() is not None:
                raise RuntimeError(f"airflow {name} exited with {process.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    logs = "\n".join(f"--- {name}\n{log.read_text()[-2000:]}" for name, (_, log) in processes.items())
    raise RuntimeError(f"{url} not healthy after {STARTUP_SECONDS}s:\n{logs}")


def stop(processes: Sequence[subprocess.Popen]) -> None:
    """SIGTERM every component's process group, SIGKILL what is still there after 30 s."""
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
    for process in processes:
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
