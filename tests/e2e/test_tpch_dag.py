"""`airflow dags test example_tpch_pricing_summary` while TPC-H refreshes (RF1, RF2) keep
committing to `lineitem`: the Q1-style summary and the MV built on it (MV-on-MV) then
equal their queries recomputed independently at every commit's watermark. The
`spark-submit` command the summary's catch-up task logged, pasted into a shell after
`source scripts/env.sh`, reruns that phase over refreshes committed since."""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from pathlib import Path
from types import ModuleType

import pytest
from airflow_processes import prepare_database, run_airflow
from deltalake import DeltaTable
from helpers_delta import mv_commits

from airflow_backfill import tpch
from oracle import assert_every_commit_matches

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


class Refresher(threading.Thread):
    """Alternates RF1 and RF2 on the TPC-H tables every `interval` seconds until stopped.

    Given `target` (an MV the DAG builds), it pauses once `after_snapshot` refreshes have
    committed after the MV's snapshot, until the MV's catch-up has committed (refreshes
    faster than a round would only keep the lag above its threshold for more rounds; at
    most `pause` seconds, so that a catch-up that found nothing to apply still leaves
    forward new epochs), and ends once the MV's forward phase has committed."""

    def __init__(self, tables: tpch.TpchTables, interval: float = 1.0, target: str | None = None,
                 after_snapshot: int = 2, pause: float = 20.0) -> None:
        super().__init__(name="tpch-refresher", daemon=True)
        self.tables = tables
        self.interval = interval
        self.target, self.after_snapshot, self.pause = target, after_snapshot, pause
        self.stop = threading.Event()
        self.refreshes: list[tpch.RefreshResult] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        since_snapshot, paused_at = 0, None
        try:
            while not self.stop.wait(self.interval):
                phases = _committed_phases(self.target) if self.target is not None else set()
                if "forward" in phases:
                    return
                if since_snapshot >= self.after_snapshot and "catch_up" not in phases:
                    paused_at = paused_at or time.monotonic()
                    if time.monotonic() - paused_at < self.pause:
                        continue
                refresh = tpch.insert_new_orders if len(self.refreshes) % 2 == 0 else tpch.delete_old_orders
                self.refreshes.append(refresh(self.tables, seed=3, count=5))
                since_snapshot += "snapshot" in phases
        except BaseException as error:  # reported by the test
            self.error = error


def _committed_phases(target: str) -> set[str]:
    """The phases that have committed to the MV at `target` (none before it exists)."""
    try:
        return {commit["airflow_backfill.phase"] for commit in mv_commits(target)}
    except Exception:  # not created yet
        return set()


def load_example_dag(home: Path, name: str) -> ModuleType:
    """The example DAG file `dags/<name>.py` as a module, its jobs' paths expanded under `home`."""
    import importlib.util

    os.environ["AIRFLOW_BACKFILL_HOME"] = str(home)
    try:
        spec = importlib.util.spec_from_file_location(name, ROOT / "dags" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        del os.environ["AIRFLOW_BACKFILL_HOME"]
    return module


def load_example_jobs(home: Path):
    """The DAG file's jobs, with their paths expanded under `home`."""
    module = load_example_dag(home, "example_tpch_pricing_summary")
    return module.PRICING_SUMMARY, module.LINESTATUS_TOTALS


def logged_command(output: str, phase: str, job_name: str) -> str:
    """The command the Spark provider logged for `phase` of `job_name`, as a person copies it
    from the task's log (the text after `Spark-Submit cmd: `, without the logger's suffix)."""
    commands = re.findall(r"Spark-Submit cmd: (spark-submit .*?) \[airflow\.task", output)
    mine = [command for command in commands if f"--name airflow_backfill-{job_name}-{phase} " in command]
    assert len(mine) == 1, f"{len(mine)} logged {phase} commands of {job_name} among {len(commands)}"
    return mine[0]


def rerun_in_a_shell(command: str) -> subprocess.CompletedProcess:
    """`command` pasted into bash in the checkout, after `source scripts/env.sh`."""
    return subprocess.run(["bash", "-c", f"source scripts/env.sh && {command}"], cwd=ROOT, env=dict(os.environ),
                          capture_output=True, text=True, timeout=600)


def airflow_environment(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """Where the example's tables go, and the environment of an `airflow` command with a
    private home and database reading the checkout's dags/."""
    home = tmp_path / "tables"
    env = {**os.environ, "AIRFLOW_BACKFILL_HOME": str(home),
           "AIRFLOW_HOME": str(tmp_path / "airflow"), "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags")}
    (tmp_path / "airflow").mkdir()
    prepare_database(tmp_path / "airflow" / "airflow.db", env)
    return home, env


def dags_test_under_refreshes(dag_id: str, env: dict[str, str], tables: tpch.TpchTables, target: str,
                              interval: float = 3.0) -> str:
    """`airflow dags test dag_id` (one forward epoch, a short idle wait) while RF1 and RF2
    alternate every `interval` seconds (paced by the MV at `target`, see `Refresher`); its
    output, once it and the refreshes succeeded."""
    refresher = Refresher(tables, interval, target=target)
    refresher.start()
    try:
        run = run_airflow("dags", "test", dag_id, "--conf", '{"forward_max_epochs": 1, "forward_idle_timeout": 5}',
                          env=env, timeout=900)
    finally:
        refresher.stop.set()
        refresher.join(timeout=120)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-5000:]
    assert refresher.error is None, refresher.error
    kinds = {refresh.kind for refresh in refresher.refreshes}
    assert kinds == {"RF1", "RF2"}, f"the upstream was not refreshed during the run: {refresher.refreshes}"
    return output


def test_dags_test_builds_both_mvs_while_refreshes_commit(tmp_path):
    home, env = airflow_environment(tmp_path)
    tables = tpch.load_tpch(str(home / "tpch"), 0.01, files=4)
    summary, totals = load_example_jobs(home)
    assert summary.source == tables.lineitem and totals.source == summary.target
    # a short idle wait for the totals: nothing refreshes the summary while its own tasks do not run
    output = dags_test_under_refreshes("example_tpch_pricing_summary", env, tables, summary.target)

    # More epochs than the summary's lag threshold, then its logged catch-up command by hand.
    command = logged_command(output, "catch_up", summary.name)
    assert "eyJ" not in command and "***" not in command
    for refresh in (tpch.insert_new_orders, tpch.delete_old_orders, tpch.insert_new_orders):
        refresh(tables, seed=4, count=5)
    rerun = rerun_in_a_shell(command)
    assert rerun.returncode == 0, (rerun.stdout + rerun.stderr)[-5000:]
    assert DeltaTable(summary.target).transaction_version(summary.app_id) == DeltaTable(tables.lineitem).version()
    assert mv_commits(summary.target)[-1]["airflow_backfill.phase"] == "catch_up"

    checked: dict[str, int] = {}
    for job in (summary, totals):
        for task in ("pin_epoch", "snapshot", "catch_up", "wait_caught_up", "forward"):
            assert f"{job.name.removeprefix('tpch_')}.{task}" in output
        watermark = DeltaTable(job.target).transaction_version(job.app_id)
        assert watermark is not None and watermark >= 0
        group_key = ["l_returnflag", "l_linestatus"] if job is summary else ["l_linestatus"]
        checked[job.name] = assert_every_commit_matches(job.source, job.target, job.query, job.app_id,
                                                        key=group_key)
    # The summary applied refreshes committed after its snapshot epoch. `dags test` runs one
    # task at a time, so the totals' upstream (the summary) only changes while none of the
    # totals' tasks runs: its snapshot may be its only commit (test_mv_on_mv covers MV-on-MV
    # catch-up and forward).
    summary_phases = {entry.get("airflow_backfill.phase") for entry in mv_commits(summary.target)}
    assert summary_phases >= {"snapshot", "forward"} and checked[summary.name] >= 2
    assert checked[totals.name] >= 1
