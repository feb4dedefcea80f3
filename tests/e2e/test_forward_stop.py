"""Stopping forward the way Airflow 3.3's task supervisor does: SIGTERM to the task's
whole process group (spark-submit's JVM and the Python driver), SIGKILL 5 s later. The
driver's stop grace ends it inside that window, and the MV stays exact at every commit."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from deltalake import DeltaTable
from submit_process import spark_submit, submit_env
from test_crash_recovery import APP_ID, QUERY, live_upstream  # noqa: F401 - fixture
from test_spark_submit import snapshot_in_process, write_job

from airflow_backfill.engine.delta.jars import delta_spark_conf
from oracle import assert_every_commit_matches

pytestmark = pytest.mark.e2e

AIRFLOW_KILL_ESCALATION = 5.0  # supervisor.kill(escalation_delay=5.0): SIGTERM, then SIGKILL


def submit(phase: str, *args: str) -> list[str]:
    """spark-submit of a phase with the Delta jars on the driver's classpath, as the operators pass them."""
    command = spark_submit(phase, *args)
    conf = [part for key, value in delta_spark_conf().items() for part in ("--conf", f"{key}={value}")]
    return [command[0], *conf, *command[1:]]


def test_forward_stopped_like_airflow_stops_a_task(spark, tmp_path, live_upstream):  # noqa: F811 - the fixture
    tables = live_upstream
    job = write_job(tmp_path, tables)
    snapshotted = snapshot_in_process(spark, job).epoch
    forward = subprocess.Popen(submit("forward", "--job", str(job), "--stop-grace", "3"),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               start_new_session=True, env=submit_env())
    deadline = time.monotonic() + 120
    while DeltaTable(tables["target"]).transaction_version(APP_ID) <= snapshotted:   # until forward commits
        assert forward.poll() is None, forward.stderr.read()[-3000:] if forward.stderr else "forward died"
        assert time.monotonic() < deadline, "forward made no commit in 120 s"
        time.sleep(0.2)
    os.killpg(forward.pid, signal.SIGTERM)
    stopped = time.monotonic()
    try:
        forward.wait(timeout=AIRFLOW_KILL_ESCALATION)
        in_time = True
    except subprocess.TimeoutExpired:
        os.killpg(forward.pid, signal.SIGKILL)
        forward.wait(timeout=30)
        in_time = False
    assert in_time, f"forward was still running {time.monotonic() - stopped:.1f} s after SIGTERM"
    assert_every_commit_matches(tables["source"], tables["target"], QUERY, APP_ID, key=["order_id"])
