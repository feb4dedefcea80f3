"""Section 5: what the Airflow layer costs on top of the phases' Spark work.

`airflow dags test bench_lineitem_mv` runs the whole backfill (pin epoch, snapshot,
catch-up, wait, forward) as spark-submit tasks. Its wall time is compared with the time
the engine itself reports for the phases' work (the snapshot's seconds and the catch-up
rounds' seconds, from the MV's state file); forward's idle timeout is a deliberate wait
and is reported separately. What remains is Airflow, task start-up and the spark-submit
JVMs. `airflow db migrate` of the private Airflow home runs first and is not counted.
Skipped with a clear line when the Airflow layer is not importable.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

from airflow_backfill import tpch
from bench.measure import MemorySampler, stopwatch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DAG_ID = "bench_lineitem_mv"
JOB_NAME = "bench_dag_lineitem_mv"
FORWARD_IDLE_TIMEOUT_S = 1.0
TIMEOUT_S = 20 * 60


def airflow_env(work_dir: str, tables: tpch.TpchTables, backfill_parallelism: int) -> dict[str, str]:
    """A private Airflow home in the work folder (SQLite) with the benchmark's DAG folder.

    Private, so the run never touches the checkout's Airflow database that other
    commands may be using at the same time.
    """
    bin_dir = os.path.dirname(sys.executable)
    env = dict(os.environ)
    env.update({
        "PATH": os.pathsep.join([bin_dir, env.get("PATH", "")]),
        "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")])),
        "AIRFLOW_HOME": os.path.join(work_dir, "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": os.path.join(ROOT, "bench", "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW_CONN_SPARK_DEFAULT": env.get("AIRFLOW_CONN_SPARK_DEFAULT", "spark://local?deploy-mode=client"),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "BENCH_TPCH_ROOT": tables.root,
        "BENCH_MV_ROOT": os.path.join(work_dir, "dag-mv"),
        "BENCH_BACKFILL_PARALLELISM": str(backfill_parallelism),
        "BENCH_FORWARD_IDLE_TIMEOUT": str(FORWARD_IDLE_TIMEOUT_S),
    })
    return env


def unavailable_reason(env: dict[str, str]) -> str | None:
    """None when the Airflow layer imports, else the import error (in a throw-away process)."""
    completed = subprocess.run(
        [sys.executable, "-c", "import airflow_backfill.task_group"], env=env, cwd=ROOT,
        capture_output=True, text=True, timeout=300, check=False,
    )
    if completed.returncode == 0:
        return None
    lines = [line for line in completed.stderr.strip().splitlines() if line.strip()]
    return lines[-1] if lines else f"exit code {completed.returncode}"


def orchestration_overhead(work_dir: str, tables: tpch.TpchTables, args: argparse.Namespace) -> dict[str, Any]:
    env = airflow_env(work_dir, tables, args.backfill_parallelism)
    reason = unavailable_reason(env)
    if reason is not None:
        return {"status": f"not available: airflow_backfill.task_group cannot be imported ({reason})"}
    airflow = os.path.join(os.path.dirname(sys.executable), "airflow")
    with stopwatch() as migrate_elapsed:
        migrated = subprocess.run([airflow, "db", "migrate"], env=env, cwd=ROOT, capture_output=True, text=True,
                                  timeout=TIMEOUT_S, check=False)
    if migrated.returncode != 0:
        return {"status": f"failed: airflow db migrate exited {migrated.returncode}: {migrated.stderr[-500:]}"}
    log_path = os.path.join(work_dir, "orchestration.log")
    with open(log_path, "w") as log_file, stopwatch() as elapsed:
        process = subprocess.Popen([airflow, "dags", "test", DAG_ID], env=env, cwd=ROOT,
                                   stdout=log_file, stderr=subprocess.STDOUT)
        with MemorySampler(process.pid) as memory:
            returncode = process.wait(timeout=TIMEOUT_S)
    wall = elapsed()
    if returncode != 0:
        return {"status": f"failed: airflow dags test exited {returncode}, see {log_path}",
                "memory": memory.peaks_mib()}
    state = _state(os.path.join(env["BENCH_MV_ROOT"], JOB_NAME))
    snapshot_s = float(state.get("snapshot_seconds") or 0.0)
    catch_up_s = sum(float(r.get("seconds", 0.0)) for r in state.get("catch_up_rounds") or [])
    spark_s = snapshot_s + catch_up_s
    if not spark_s:
        return {"status": f"failed: the MV's state file recorded no phase time, see {log_path}",
                "memory": memory.peaks_mib()}
    return {
        "dag_id": DAG_ID,
        "db_migrate_s": round(migrate_elapsed(), 3),
        "wall_s": round(wall, 3),
        "snapshot_s": round(snapshot_s, 3),
        "catch_up_s": round(catch_up_s, 3),
        "spark_s": round(spark_s, 3),
        "forward_idle_s": FORWARD_IDLE_TIMEOUT_S,
        "overhead_s": round(wall - spark_s - FORWARD_IDLE_TIMEOUT_S, 3),
        "ratio": round(wall / spark_s, 3),
        "tasks_s": task_durations(os.path.join(env["AIRFLOW_HOME"], "airflow.db")),
        "memory": memory.peaks_mib(),
    }


def task_durations(database: str) -> dict[str, float]:
    """Each task's duration as Airflow recorded it (task id without the group prefix)."""
    import sqlite3
    from contextlib import closing

    try:
        with closing(sqlite3.connect(database)) as connection:
            rows = connection.execute("SELECT task_id, duration FROM task_instance").fetchall()
    except sqlite3.Error:
        return {}
    return {task_id.rsplit(".", 1)[-1]: round(float(duration or 0.0), 3) for task_id, duration in rows}


def _state(target: str) -> dict[str, Any]:
    from airflow_backfill.engine.job_state import STATE_DIR, STATE_FILE

    try:
        with open(os.path.join(target, STATE_DIR, STATE_FILE)) as handle:
            return json.load(handle)
    except FileNotFoundError:
        return {}
