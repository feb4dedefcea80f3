"""The README's DAG as a deployment holds it (the DAG file in a DAG folder, its job file
in `jobs/` beside it) runs under `airflow dags test` from a working directory that holds
neither: its relative job path is read beside the DAG file. Every process runs under
`TZ=Europe/Berlin` while the simulator keeps writing the upstream, so catch-up and forward
apply small rounds of updated rows (their `updated_at` timestamps once landed an hour off
there). The MV equals the query recomputed independently at every commit's watermark."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from airflow_processes import airflow_command, prepare_database
from helpers_delta import mv_commits
from readme_dag import readme_deployment

from oracle import assert_every_commit_matches

pytestmark = pytest.mark.e2e


def test_the_readme_dag_runs_with_the_working_directory_elsewhere(tmp_path):
    home = tmp_path / "home"
    airflow_home = tmp_path / "airflow"
    airflow_home.mkdir()
    dags = readme_deployment(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "AIRFLOW_BACKFILL_HOME": str(home), "AIRFLOW_HOME": str(airflow_home),
           "AIRFLOW__CORE__DAGS_FOLDER": str(dags), "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "TZ": "Europe/Berlin"}
    prepare_database(airflow_home / "airflow.db", env)
    simulate = [str(Path(sys.executable).with_name("airflow-backfill")), "simulate", "--table", str(home / "orders"),
                "--rows", "500", "--epoch-interval", "0.5"]
    subprocess.run([*simulate, "--max-epochs", "2"], cwd=elsewhere, env=env, check=True, capture_output=True,
                   timeout=180)
    live = subprocess.Popen(simulate, cwd=elsewhere, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # keeps writing until the backfill is done
    try:
        conf = {"forward_max_epochs": 5, "forward_idle_timeout": 60}  # forward applies five more epochs
        run = subprocess.run(
            airflow_command("dags", "test", "orders_mv", "--conf", json.dumps(conf)),
            cwd=elsewhere, env=env, capture_output=True, text=True, timeout=900,
        )
    finally:
        live.terminate()
        live.wait(timeout=60)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-6000:]

    job = yaml.safe_load((dags / "jobs" / "orders_mv.yaml").read_text())
    target = str(home / "orders_mv")
    phases = [commit["airflow_backfill.phase"] for commit in mv_commits(target)]
    assert phases[0] == "snapshot" and len(phases) >= 2, phases  # rounds applied the live writes
    checked = assert_every_commit_matches(str(home / "orders"), target, job["query"], "airflow_backfill/orders_mv",
                                          key=job["primary_key"])
    assert checked >= 1
    assert not (elsewhere / "jobs").exists()
