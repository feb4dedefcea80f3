"""A folder of jobs run by a real Airflow on PostgreSQL (scheduler, DAG processor,
triggerer and API server on loopback, LocalExecutor), as production Airflow runs: the
folder is backfilled as one by the shared forward's application (an MV over another MV
after that MV; each job's DAG waits for its MV to catch up), which then keeps them all
fresh while a simulator keeps writing the upstream, a DAG scheduled on one MV's asset
runs after a shared-forward
commit (the MV's watcher in the triggerer; its task checks the event's watermark against
the MV's log, and the delay from the commit to the run's start is printed and held to
30 s), a bad job file is an import error that hides no other DAG, and an MV whose table is
deleted is reported while the others stay fresh. Every MV is checked at every commit with
the oracle. Sized for CI: three MVs, a few minutes."""

from __future__ import annotations

import json
import os
import signal
import textwrap
from pathlib import Path

import httpx
import pytest
import yaml
from airflow_processes import airflow_env, run_airflow, start, stop, wait_until_healthy
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError
from helpers_delta import mv_commits
from test_dag_run import RunningAirflow, wait_for
from test_spark_submit import start_simulator

from airflow_backfill.engine import job_state
from airflow_backfill.loopback import free_port
from airflow_backfill.shared_forward.backfill import BACKFILLED_BY
from oracle import assert_every_commit_matches

pytestmark = pytest.mark.e2e

RUN_TIMEOUT_S = 900
DAG_FILE = """
from airflow_backfill.folder_dags import backfill_dags

from datetime import timedelta

# Retries as a deployment sets them: a task process that dies at start on a loaded
# machine is started again (every phase resumes from what was committed).
backfill_dags("../jobs", forward_kwargs={{"status_file": {status!r}, "poll_interval": 0.2}},
              default_args={{"retries": 2, "retry_delay": timedelta(seconds=5)}})
"""
CONSUMER_DAG_ID = "orders_mv_consumer"
CONSUMER_FILE = """
import json
import time

import pendulum
from airflow.sdk import DAG, task
from deltalake import DeltaTable

from airflow_backfill.asset_events import mv_event_fields
from airflow_backfill.folder_dags import folder_mv_asset

ORDERS_MV = folder_mv_asset("../jobs", "orders_mv")

with DAG({dag_id!r}, schedule=[ORDERS_MV], start_date=pendulum.datetime(2026, 1, 1), catchup=False,
         max_active_runs=1):

    @task
    def read_watermark(triggering_asset_events=None, dag_run=None):
        started = time.time()
        events = []
        for event in triggering_asset_events[ORDERS_MV]:
            fields = mv_event_fields(event)
            version, watermark = fields["airflow_backfill.mv_version"], fields["airflow_backfill.watermark"]
            mv = DeltaTable(ORDERS_MV.uri.removeprefix("file://"), version=version)
            committed = mv.transaction_version("airflow_backfill/orders_mv")
            if committed != watermark:
                raise ValueError(f"the event says watermark {{watermark}} at MV version {{version}}, "
                                 f"the MV committed {{committed}} there")
            events.append({{**fields, "from_trigger": bool(event.extra.get("from_trigger")),
                           "event_timestamp": event.timestamp.timestamp()}})
        with open({out!r}, "a") as out:
            out.write(json.dumps({{"run_id": dag_run.run_id, "task_started": started, "events": events}}) + "\\n")

    read_watermark()
"""
JOBS = {
    "orders_mv": ("orders", "SELECT order_id, customer_id, status, amount * quantity AS total FROM source "
                            "WHERE status <> 'cancelled'"),
    "status_totals": ("orders_mv", "SELECT status, COUNT(*) AS orders, SUM(total) AS total FROM source "
                                   "GROUP BY status"),
    "doomed": ("orders", "SELECT order_id, status FROM source"),
}


def write_folder(root: Path, status_file: Path, consumer_out: Path) -> None:
    (root / "jobs").mkdir()
    (root / "dags").mkdir()
    for name, (source, query) in JOBS.items():
        (root / "jobs" / f"{name}.yaml").write_text(yaml.safe_dump({
            "name": name, "source": f"lake/{source}", "target": f"lake/{name}", "query": query,
            "primary_key": ["order_id"], "backfill_parallelism": 1, "parallelism": 1, "lag_threshold": 2,
            "poll_interval": 0.5,
        }))
    (root / "jobs" / "broken.yaml").write_text("name: broken\nsource: lake/orders\ntarget: lake/broken\n"
                                               "query: SELECT order_id FROM source\nprimary_key: [order_id]\n"
                                               "rate_limit: -5\n")
    (root / "dags" / "jobs.py").write_text(textwrap.dedent(DAG_FILE.format(status=str(status_file))))
    (root / "dags" / "consumer.py").write_text(CONSUMER_FILE.format(dag_id=CONSUMER_DAG_ID, out=str(consumer_out)))


def test_a_folder_of_jobs_on_postgres_keeps_every_mv_fresh(tmp_path, postgres):
    root = tmp_path / "platform"
    root.mkdir()
    status_file = tmp_path / "shared_forward.json"
    consumer_out = tmp_path / "consumer_runs.jsonl"
    write_folder(root, status_file, consumer_out)
    home = tmp_path / "airflow"
    home.mkdir()
    url = f"http://127.0.0.1:{free_port()}"
    env = {
        **airflow_env(home, root / "dags", url, {"admin": "admin-secret"}, {"admin": "admin"}),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": postgres.sqlalchemy_url,
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{url}/execution/",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
        "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": "True",
        "AIRFLOW_CONN_SPARK_DEFAULT": "spark://local?deploy-mode=client",
    }
    migrated = run_airflow("db", "migrate", env=env, timeout=600)
    assert migrated.returncode == 0, migrated.stdout[-3000:] + migrated.stderr[-3000:]
    # An upstream commit every 4 s: three MVs' backfills and the shared forward share two
    # cores with the other test process, and each commit is work for every MV.
    simulator = start_simulator(str(root / "jobs" / "lake" / "orders"), seed=62, epoch_interval=4)
    components = {
        "api-server": ["api-server", "--host", "127.0.0.1", "--port", url.rsplit(":", 1)[1], "--workers", "1"],
        "scheduler": ["scheduler", "--skip-serve-logs"],
        "dag-processor": ["dag-processor"],
        "triggerer": ["triggerer", "--skip-serve-logs"],
    }
    started = {name: (start(args, env, home / f"{name}.log"), home / f"{name}.log") for name, args in components.items()}
    lake = root / "jobs" / "lake"
    try:
        wait_until_healthy(f"{url}/api/v2/monitor/health", started)
        token = httpx.post(f"{url}/auth/token", json={"username": "admin", "password": "admin-secret"}, timeout=30)
        token.raise_for_status()
        airflow = RunningAirflow(env=env, url=url, logs={name: log for name, (_, log) in started.items()},
                                 token=token.json()["access_token"])
        wait_for(lambda: _import_error(airflow), "the bad job file's import error", 180, airflow)
        expected = {"orders_mv", "status_totals", "doomed", "shared_forward", CONSUMER_DAG_ID}
        wait_for(lambda: {dag["dag_id"] for dag in airflow.get("/dags")["dags"]} == expected,
                 "the other jobs' DAGs beside the import error", 120, airflow)

        # Every MV built by its DAG, then kept fresh by the shared forward.
        def all_following() -> bool:
            latest = DeltaTable(str(lake / "orders")).version()
            return all(_reflects(lake, name, latest) for name in ("orders_mv", "doomed"))

        wait_for(all_following, "both MVs over the upstream following it", RUN_TIMEOUT_S, airflow)
        # A DAG scheduled on orders_mv's asset runs after a shared-forward commit, told by the
        # MV's watcher; its task checked the event's watermark against the MV's log.
        consumed = wait_for(lambda: _forward_event_run(airflow, consumer_out), "a consumer run after a shared "
                            "forward commit", 240, airflow)
        _pause(airflow, CONSUMER_DAG_ID)  # measured: its runs would only take cores from the rest
        _report_delay(consumed)
        wait_for(lambda: _shared_commits(lake / "status_totals") > 0, "the MV over an MV following it",
                 RUN_TIMEOUT_S, airflow)
        os.rename(lake / "doomed", lake / "doomed.deleted")  # one MV's table deleted
        wait_for(lambda: _member(status_file, "doomed").get("failures", 0) >= 1, "the deleted MV reported",
                 120, airflow)
        before = {name: _shared_commits(lake / name) for name in ("orders_mv", "status_totals")}
        wait_for(lambda: all(_shared_commits(lake / name) > before[name] + 1 for name in before),
                 "the other MVs still committing", 240, airflow)
        runs = {dag: [run["state"] for run in airflow.get(f"/dags/{dag}/dagRuns")["dag_runs"]]
                for dag in ("orders_mv", "status_totals")}
        assert all(states and states[-1] == "success" for states in runs.values()), runs
    finally:
        simulator.send_signal(signal.SIGTERM)
        simulator.wait(timeout=60)
        stop([process for process, _ in started.values()])
    for name in ("orders_mv", "status_totals"):  # built by the folder's one application, not a DAG's tasks
        assert job_state.read_state(str(lake / name)).get("backfilled_by") == BACKFILLED_BY, name
    doomed = _member(status_file, "doomed")
    assert "no longer exists" in (doomed.get("last_error") or ""), doomed
    for name, (source, query) in JOBS.items():
        if name == "doomed":
            continue
        checked = assert_every_commit_matches(str(lake / source), str(lake / name), query, f"airflow_backfill/{name}")
        assert checked >= 3, (name, checked)


def _forward_event_run(airflow: RunningAirflow, consumer_out: Path) -> dict | None:
    """The first successful consumer run whose triggering events include a watcher's (a
    forward commit), with its events and its start as the API reports it."""
    try:
        records = [json.loads(line) for line in consumer_out.read_text().splitlines() if line.strip()]
    except OSError:
        return None
    runs = {run["dag_run_id"]: run for run in airflow.get(f"/dags/{CONSUMER_DAG_ID}/dagRuns")["dag_runs"]}
    for record in records:
        watched = [event for event in record["events"] if event["from_trigger"]]
        run = runs.get(record["run_id"])
        if watched and run is not None and run["state"] == "success":
            return {**record, "watched": watched, "run": run}
    return None


def _pause(airflow: RunningAirflow, dag_id: str) -> None:
    response = httpx.patch(f"{airflow.url}/api/v2/dags/{dag_id}", json={"is_paused": True},
                           headers={"Authorization": f"Bearer {airflow.token}"}, timeout=30)
    response.raise_for_status()


def _report_delay(consumed: dict) -> None:
    """The delay from the MV's commit to the consumer's run, by stage, printed for the report
    and held to the target (30 s)."""
    from datetime import datetime

    first = min(consumed["watched"], key=lambda event: event["airflow_backfill.mv_version"])
    assert first["airflow_backfill.phase"] == "forward" and first["airflow_backfill.commits"] >= 1, first
    committed = first["airflow_backfill.committed_at"] / 1000
    run_started = datetime.fromisoformat(consumed["run"]["start_date"]).timestamp()
    stages = {"commit -> asset event": first["event_timestamp"] - committed,
              "asset event -> run start": run_started - first["event_timestamp"],
              "run start -> task start": consumed["task_started"] - run_started}
    print(f"orders_mv version {first['airflow_backfill.mv_version']} (watermark {first['airflow_backfill.watermark']}, "
          f"{first['airflow_backfill.commits']} commit(s); {len(consumed['watched'])} watcher event(s) in the run) -> "
          f"{CONSUMER_DAG_ID} run start: {run_started - committed:.1f} s ("
          + ", ".join(f"{stage} {seconds:.1f} s" for stage, seconds in stages.items()) + ")")
    assert run_started - committed <= 30, stages


def _import_error(airflow: RunningAirflow) -> bool:
    errors = airflow.get("/importErrors")["import_errors"]
    return any("broken.yaml: rate_limit must be between 1 and" in error["stack_trace"] for error in errors)


def _reflects(lake: Path, name: str, version: int) -> bool:
    try:
        return (DeltaTable(str(lake / name)).transaction_version(f"airflow_backfill/{name}") or -1) >= version
    except TableNotFoundError:  # not created yet
        return False


def _shared_commits(target: Path) -> int:
    """The MV's commits made by a forward (the shared one is the only forward here)."""
    try:
        return sum(commit.get("airflow_backfill.phase") == "forward" for commit in mv_commits(str(target)))
    except TableNotFoundError:
        return 0


def _member(status_file: Path, name: str) -> dict:
    try:
        return json.loads(status_file.read_text())["members"].get(name, {})
    except (OSError, ValueError, KeyError):
        return {}
