"""`airflow dags test example_consistent_reads` as a user runs it: the sensor waits while the
three MVs share no epoch of `orders`, one of them moves on during the wait, then the
sensor hands its versions to the next task, which reads the three MVs at that epoch.

The MVs are built by hand with delta-rs (their rows are their queries recomputed by
DuckDB at their epochs, their watermarks the app transactions the engine writes), so the
run needs no Spark; the reading task checks that the three agree, and this test checks
its figures against the upstream at that epoch, recomputed independently."""

from __future__ import annotations

import importlib.util
import math
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pyarrow as pa
import pytest
from airflow_processes import ROOT, airflow_command, prepare_database
from deltalake import DeltaTable
from helpers_delta import write_mv_version

from airflow_backfill.simulator import commit_epoch, create_orders_table
from oracle import expected_rows

pytestmark = pytest.mark.e2e
EXAMPLE = ROOT / "dags" / "example_consistent_reads.py"



def example_jobs() -> dict:
    """The example DAG's jobs (tables under $AIRFLOW_BACKFILL_HOME), by name."""
    spec = importlib.util.spec_from_file_location("example_consistent_reads", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {job.name: job for job in (module.ORDERS_MV, module.ORDER_STATUS_COUNTS, module.REVENUE_BY_CUSTOMER)}


def commit_mv(job, upstream_version: int) -> int:
    """The job's MV as its query over its upstream at `upstream_version`, with that watermark."""
    rows = expected_rows(job.source, upstream_version, job.query)
    return write_mv_version(job.target, pa.table(rows), job.app_id, upstream_version)


def wait_for_text(log: Path, text: str, process: subprocess.Popen, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        assert process.poll() is None, f"airflow dags test ended first:\n{log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, f"{text!r} not seen within {timeout:.0f} s"
        time.sleep(0.2)


def test_the_sensor_waits_for_one_epoch_then_the_next_task_reads_the_mvs_at_it(tmp_path, monkeypatch):
    home = str(tmp_path / "tables")
    monkeypatch.setenv("AIRFLOW_BACKFILL_HOME", home)
    jobs = example_jobs()
    orders = jobs["orders_mv"].source
    create_orders_table(orders, rows=300, seed=5)
    rng = random.Random(5)
    for _ in range(3):
        commit_epoch(orders, rng, inserts=20, updates=30, deletes=10)  # orders versions 1..3
    commit_mv(jobs["orders_mv"], 1)  # version 0
    commit_mv(jobs["orders_mv"], 3)  # version 1
    commit_mv(jobs["order_status_counts"], 2)
    commit_mv(jobs["order_status_counts"], 3)
    commit_mv(jobs["revenue_by_customer"], 0)  # orders_mv's version 0 reflects orders@1: nobody else has it

    env = {**os.environ, "AIRFLOW_BACKFILL_HOME": home, "AIRFLOW_HOME": str(tmp_path / "airflow"),
           "AIRFLOW__CORE__DAGS_FOLDER": str(EXAMPLE),
           "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": "True"}
    (tmp_path / "airflow").mkdir()
    prepare_database(tmp_path / "airflow" / "airflow.db", env)
    log = tmp_path / "dags_test.log"
    started = time.monotonic()
    with open(log, "w") as output_file:
        run = subprocess.Popen(airflow_command("dags", "test", "example_consistent_reads", "--conf",
                                               '{"min_epochs": 3}'), env=env, stdout=output_file,
                               stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_for_text(log, "do not agree yet", run)  # the sensor checked and found no shared epoch
            commit_mv(jobs["revenue_by_customer"], 1)  # catches up: orders_mv's version 1, orders@3
            returncode = run.wait(timeout=600)
        finally:
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGTERM)
                run.wait(timeout=30)
    output = log.read_text()
    assert returncode == 0, output[-6000:]
    print(f"airflow dags test took {time.monotonic() - started:.0f} s")

    assert "do not agree yet: the tables share no upstream epoch" in output  # it checked, then
    assert "Pausing task as DEFERRED" in output and "Trigger completed" in output  # waited in the trigger
    assert DeltaTable(jobs["revenue_by_customer"].target).version() == 1
    expected = expected_rows(orders, 3, "SELECT COUNT(*) AS n, SUM(amount * quantity) AS total FROM source "
                                        "WHERE status <> 'cancelled'")
    line = next(line for line in output.splitlines() if "read at {" in line)
    assert f"'{orders}': 3" in line
    read = line[line.index("'orders_mv': {"):]
    orders_read = int(read.split("'orders': ", 1)[1].split(",", 1)[0])
    total_read = float(read.split("'total': ", 1)[1].split("}", 1)[0])
    assert orders_read == expected.column("n")[0].as_py()
    assert math.isclose(total_read, expected.column("total")[0].as_py(), rel_tol=1e-9)
