"""Airflow's own processes with the many_mvs folder's DAGs parsed: their resident memory."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from bench.tree_sampler import Pid, TreeSampler

AIRFLOW_DAG_FILE = """
from airflow_backfill.folder_dags import backfill_dags

backfill_dags({folder!r})
"""


def airflow_stack_memory(work: Path) -> dict[str, Any]:
    """Airflow's own processes with the folder's DAGs parsed (scheduler, DAG processor,
    triggerer, API server on PostgreSQL, DAGs paused so nothing runs): their resident
    memory over 30 s once every DAG is parsed."""
    tests = str(Path(__file__).resolve().parents[1] / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    from airflow_processes import airflow_env, run_airflow, start
    from airflow_processes import stop as stop_airflow
    from postgres import postgres_server

    from airflow_backfill.loopback import free_port

    home = work / "airflow"
    dags = home / "dags"
    dags.mkdir(parents=True, exist_ok=True)
    (dags / "jobs.py").write_text(AIRFLOW_DAG_FILE.format(folder=str(work / "jobs")))
    url = f"http://127.0.0.1:{free_port()}"
    with postgres_server() as database:
        env = {**airflow_env(home, dags, url, {"admin": "admin-secret"}, {"admin": "admin"}),
               "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": database.sqlalchemy_url,
               "AIRFLOW__CORE__EXECUTOR": "LocalExecutor", "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
               "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{url}/execution/"}
        migrated = run_airflow("db", "migrate", env=env, timeout=900)
        if migrated.returncode != 0:
            return {"status": f"failed: airflow db migrate: {migrated.stderr[-300:]}"}
        processes = [start(["api-server", "--host", "127.0.0.1", "--port", url.rsplit(":", 1)[1], "--workers", "1"],
                           env, home / "api-server.log"),
                     start(["scheduler", "--skip-serve-logs"], env, home / "scheduler.log"),
                     start(["dag-processor"], env, home / "dag-processor.log"),
                     start(["triggerer", "--skip-serve-logs"], env, home / "triggerer.log")]
        postmaster = database.postmaster_pid()
        try:
            time.sleep(90.0)  # start-up and the first parse of the folder's DAGs
            sampler = TreeSampler([*processes, *([Pid(postmaster)] if postmaster is not None else [])])
            time.sleep(30.0)
            usage = sampler.stop()
        finally:
            stop_airflow(processes)
    return {**usage, "what": "api-server (1 worker), scheduler (LocalExecutor, default parallelism), "
            "dag-processor, triggerer and PostgreSQL's server, each with its children"}
