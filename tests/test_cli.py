"""The `airflow-backfill` command: simulate, status, and clear errors with exit code 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from deltalake import DeltaTable, write_deltalake
from helpers_delta import write_mv_version

from airflow_backfill.cli import main
from airflow_backfill.engine import job_state
from airflow_backfill.engine.status import job_status
from airflow_backfill.job import load_job

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def paths(tmp_path: Path) -> dict[str, str]:
    return {"source": str(tmp_path / "orders"), "target": str(tmp_path / "orders_mv")}


def write_job(tmp_path: Path, paths: dict[str, str], **fields) -> Path:
    job = {"name": "orders_mv", "query": "SELECT order_id, status FROM source", "primary_key": ["order_id"],
           **paths, **fields}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def simulate(table: str, *extra: str) -> int:
    return main(["simulate", "--table", table, "--rows", "100", "--epoch-interval", "0",
                 "--inserts", "3", "--updates", "5", "--deletes", "2", "--seed", "4", *extra])


def test_simulate_with_max_epochs(paths, capsys):
    assert simulate(paths["source"], "--max-epochs", "3") == 0
    assert DeltaTable(paths["source"]).version() == 3
    assert json.loads(capsys.readouterr().out) == {"table": paths["source"], "epochs": 3}


def test_simulate_logs_progress_to_stderr(paths):
    done = subprocess.run(
        [sys.executable, "-m", "airflow_backfill.cli", "simulate", "--table", paths["source"], "--rows", "20",
         "--epoch-interval", "0", "--max-epochs", "2"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert "created upstream" in done.stderr
    assert "epoch 2: version 2 (50 inserts" in done.stderr


def test_simulate_stops_cleanly_on_sigterm(paths):
    process = subprocess.Popen(
        [sys.executable, "-m", "airflow_backfill.cli", "simulate", "--table", paths["source"], "--rows", "50",
         "--epoch-interval", "0.1", "--inserts", "2", "--updates", "2", "--deletes", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 60
        while not DeltaTable.is_deltatable(paths["source"]) or DeltaTable(paths["source"]).version() < 2:
            assert process.poll() is None, process.communicate()[1]
            assert time.monotonic() < deadline, "the simulator did not commit two epochs"
            time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr
    assert "SIGTERM received: stopping after the current commit" in stderr
    assert json.loads(stdout)["epochs"] == DeltaTable(paths["source"]).version()


def test_simulate_refuses_an_upstream_without_the_change_feed(paths, capsys):
    write_deltalake(paths["source"], pa.table({"order_id": pa.array([1], pa.int64())}))
    assert simulate(paths["source"], "--max-epochs", "1") == 2
    err = capsys.readouterr().err
    assert "does not have the Change Data Feed" in err and "Traceback" not in err


def test_status_of_a_job_that_never_ran(tmp_path, paths, capsys):
    job = write_job(tmp_path, paths)
    assert main(["status", "--job", str(job)]) == 0
    out = capsys.readouterr().out
    assert "job             orders_mv" in out
    assert "state           not started" in out
    assert "watermark       -" in out
    assert "the upstream table does not exist yet" in out
    assert "the MV has not been created" in out


def test_status_json_with_a_live_upstream_and_no_mv(tmp_path, paths, capsys):
    simulate(paths["source"], "--max-epochs", "2")
    capsys.readouterr()
    job = write_job(tmp_path, paths)
    assert main(["status", "--job", str(job), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["state"] == "not started"
    assert status["phase"] is None and status["watermark"] is None and status["pending_epochs"] is None
    assert status["upstream_version"] == 2


def test_status_of_a_mv_behind_the_upstream(tmp_path, paths, capsys):
    simulate(paths["source"], "--max-epochs", "3")
    capsys.readouterr()
    job = write_job(tmp_path, paths)
    write_mv_version(paths["target"], pa.table({"order_id": pa.array([1], pa.int64())}),
                     "airflow_backfill/orders_mv", watermark=1)
    job_state.update_state(paths["target"], phase="catch_up", state="creating",
                           catch_up_rounds=[{"round": 1, "pending_epochs": 4, "change_rows": 12, "seconds": 0.5}])
    status = job_status(load_job(job))
    assert (status.phase, status.state, status.watermark) == ("catch_up", "creating", 1)
    assert (status.upstream_version, status.pending_epochs, status.mv_version) == (3, 2, 0)

    assert main(["status", "--job", str(job)]) == 0
    out = capsys.readouterr().out
    assert "phase           catch_up" in out and "state           creating" in out
    assert "pending epochs  2" in out
    assert "catch-up        1 rounds; last: 4 pending epochs, 12 change rows" in out


def test_bad_job_file_exits_2_with_one_line(tmp_path, paths, capsys):
    job = tmp_path / "job.yaml"
    job.write_text(f"name: x\nsource: {paths['source']}\ntarget: {paths['target']}\nquery: SELECT 1\n")
    assert main(["status", "--job", str(job)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("airflow-backfill status: error: job file")
    assert "missing required field(s) primary_key" in err
    assert "\n" not in err and "Traceback" not in err


def test_missing_job_file_exits_2(tmp_path, capsys):
    assert main(["status", "--job", str(tmp_path / "nope.yaml")]) == 2
    assert "does not exist; check the path" in capsys.readouterr().err


def test_console_script_reports_a_bad_job_file(tmp_path, paths):
    job = write_job(tmp_path, paths, backfill_parallelism=0)
    binary = Path(sys.executable).with_name("airflow-backfill")
    if not binary.exists():
        pytest.skip("the package is not installed as a console script")
    done = subprocess.run([str(binary), "status", "--job", str(job)], capture_output=True, text=True,
                          timeout=60, env={**os.environ})
    assert done.returncode == 2
    assert "backfill_parallelism must be between 1 and 1024" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("argv", [
    ["simulate", "--table", "x", "--rows", "-1"],
    ["simulate", "--table", "x", "--epoch-interval", "soon"],
    ["status"],
    [],
])
def test_usage_errors_exit_2(argv, capsys):
    assert main(argv) == 2
    assert "error:" in capsys.readouterr().err
