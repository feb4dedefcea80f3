"""SIGKILL a spark-submit phase at each named point (and at random moments) while the
upstream keeps committing, rerun it (in the test's Spark: recovery reads only what the
killed process left on disk), and check the MV against the independent recomputation."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from deltalake import DeltaTable
from helpers_delta import append_orders, largest_order
from submit_process import spark_submit, submit_env
from test_spark_submit import rerun_in_process, snapshot_in_process, start_simulator, write_job

from airflow_backfill.engine.delta.log import read_watermark
from airflow_backfill.engine.writer_lock import writer_lock
from airflow_backfill.exceptions import TargetError
from airflow_backfill.simulator import commit_epoch, create_orders_table
from airflow_backfill.storage import files
from oracle import assert_every_commit_matches, assert_mv_matches

pytestmark = pytest.mark.e2e

APP_ID = "airflow_backfill/orders_e2e"
QUERY = "SELECT order_id, status, amount * quantity AS total FROM source WHERE quantity >= 2"
TIMESTAMP_WARNING = "greater than the next commit timestamp"
"""Delta's warning about out-of-order commit times, which S3's one-second `LastModified`
causes; meaningless to the engine, so quieted (docs/object_storage.md)."""
LAG_THRESHOLD = 5
"""A rerun's catch-up stops within a round or two of a simulator that commits every 2 s
(a round in a freshly started driver takes several seconds)."""


def run_phase(phase: str, job: Path, fault: str | None = None, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("AIRFLOW_BACKFILL_FAULT", None)
    if fault:
        env["AIRFLOW_BACKFILL_FAULT"] = fault
    return subprocess.run(
        spark_submit(phase, "--job", str(job), *extra), capture_output=True, text=True, timeout=600, env=submit_env(env)
    )


def make_backlog(tables: dict[str, str]) -> None:
    """Commit epochs beside the simulator's until the upstream is more than the lag
    threshold ahead of the MV, so that a catch-up started now has at least one round to run
    (and to be killed in), without waiting for the simulator's pace."""
    watermark = read_watermark(tables["target"], APP_ID)
    assert watermark is not None
    rng = random.Random(watermark)
    while DeltaTable(tables["source"]).version() <= watermark + LAG_THRESHOLD:
        commit_epoch(tables["source"], rng, inserts=20, updates=30, deletes=10)


def killed(done: subprocess.CompletedProcess) -> bool:
    # spark-submit reports its Python child's SIGKILL as a non-zero exit; the child's
    # output reaches spark-submit's stdout
    return done.returncode != 0 and "fault injection: killing" in done.stdout + done.stderr


@pytest.fixture
def live_upstream(tables):
    # Several insert-only epochs first, so the upstream has enough files for several chunks.
    create_orders_table(tables["source"], rows=2000, seed=9)
    rng = random.Random(9)
    for _ in range(4):
        commit_epoch(tables["source"], rng, inserts=200, updates=0, deletes=0)
    simulator = start_simulator(tables["source"], seed=9)
    yield tables
    simulator.send_signal(signal.SIGTERM)
    simulator.wait(timeout=60)


def test_snapshot_killed_after_chunks_then_before_commit(spark, tmp_path, live_upstream):
    tables = live_upstream
    job = write_job(tmp_path, tables)
    # Pinned at the pre-loaded version: the simulator's merges rewrite files, but the
    # pinned epoch keeps its five files, one chunk each.
    chunking = ("--chunk-bytes", "1", "--epoch", "4")
    first = run_phase("snapshot", job, "snapshot:after_chunks=2", *chunking)
    assert killed(first), first.stdout[-2000:]
    progress_file = Path(tables["target"], "_airflow_backfill", "snapshot.json")
    after_first = json.loads(progress_file.read_text())
    assert len(after_first["done"]) == 2

    second = run_phase("snapshot", job, "snapshot:after_write", *chunking)
    assert killed(second), second.stdout[-2000:]
    after_second = json.loads(progress_file.read_text())
    redone = [i for i, c in after_second["done"].items() if i in after_first["done"]
              and c["run_id"] != after_first["done"][i]["run_id"]]
    assert redone == [], "chunks finished before the crash were redone"
    # every chunk is in the MV's log, but without the watermark no reader takes it for an MV
    mv = DeltaTable(tables["target"])
    assert mv.transaction_version(APP_ID + "/snapshot") == after_second["chunks_total"] == 5
    assert read_watermark(tables["target"], APP_ID) is None

    # the rerun (in the test's own Spark) only records the watermark
    third = snapshot_in_process(spark, job, epoch=4, chunk_bytes=1)
    assert third.chunks_run == 0 and not third.skipped
    assert_mv_matches(tables["source"], tables["target"], QUERY, APP_ID, key=["order_id"])


def test_snapshot_killed_after_its_commit_is_not_redone(spark, tmp_path, live_upstream):
    tables = live_upstream
    job = write_job(tmp_path, tables)
    crashed = run_phase("snapshot", job, "snapshot:after_commit")
    assert killed(crashed), crashed.stdout[-2000:]
    committed = DeltaTable(tables["target"]).version()
    assert snapshot_in_process(spark, job).skipped
    assert read_watermark(tables["target"], APP_ID) is not None
    assert DeltaTable(tables["target"]).version() == committed, "the rerun committed again"
    assert_mv_matches(tables["source"], tables["target"], QUERY, APP_ID, key=["order_id"])


@pytest.mark.parametrize("phase", ["catch_up", "forward"])
@pytest.mark.parametrize("point", ["after_write", "after_commit"])
def test_incremental_phase_killed_at_named_point(spark, tmp_path, live_upstream, phase, point):
    tables = live_upstream
    job = write_job(tmp_path, tables, LAG_THRESHOLD)
    snapshot_in_process(spark, job)
    make_backlog(tables)
    extra = ("--max-epochs", "2", "--idle-timeout", "30") if phase == "forward" else ()
    crashed = run_phase(phase, job, f"{phase}:{point}", *extra)
    assert killed(crashed), crashed.stdout[-2000:]
    rerun_in_process(spark, phase, job)
    assert_every_commit_matches(tables["source"], tables["target"], QUERY, APP_ID, key=["order_id"])


@pytest.mark.parametrize("point", ["after_write", "after_commit"])
def test_append_round_killed_at_named_point(spark, tmp_path, tables, point):
    """A round of appends above the MV's keys (one Delta append, no MERGE) killed before and
    after its commit: the rerun neither loses nor repeats the appended rows."""
    create_orders_table(tables["source"], rows=500, seed=11)
    job = write_job(tmp_path, tables, 0)
    snapshot_in_process(spark, job)
    top = largest_order(tables["source"])
    for first in range(top + 1, top + 7, 2):
        append_orders(tables["source"], [first, first + 1])
    crashed = run_phase("catch_up", job, f"catch_up:{point}")
    assert killed(crashed), crashed.stdout[-2000:]
    assert "only appended 6 rows above the MV's largest key" in crashed.stdout + crashed.stderr
    rerun_in_process(spark, "catch_up", job)
    assert read_watermark(tables["target"], APP_ID) == DeltaTable(tables["source"]).version()
    assert_every_commit_matches(tables["source"], tables["target"], QUERY, APP_ID, key=["order_id"])


AGGREGATE_QUERY = (
    "SELECT customer_id, COUNT(*) AS orders, SUM(amount) AS revenue, MAX(quantity) AS top_quantity "
    "FROM source WHERE status <> 'cancelled' GROUP BY customer_id"
)


def test_aggregate_snapshot_killed_between_its_state_and_mv_commits(spark, tmp_path, live_upstream):
    """An aggregate commits its hidden per-group state, then the MV: a SIGKILL between the
    two is recovered by the rerun, and no reader ever saw the MV ahead of its state. (The
    catch-up's kill there runs on the loopback cluster, tests/e2e/test_spark_cluster.py,
    with an MV over the aggregate following the recovered commit.)"""
    tables = live_upstream
    job = tmp_path / "aggregate.yaml"
    job.write_text(yaml.safe_dump({
        "name": "orders_e2e", "query": AGGREGATE_QUERY, "primary_key": ["order_id"], **tables,
        "backfill_parallelism": 2, "parallelism": 1, "lag_threshold": LAG_THRESHOLD, "poll_interval": 0.2,
    }))
    crashed = run_phase("snapshot", job, "snapshot:after_state_commit")
    assert killed(crashed), crashed.stdout[-2000:]
    rerun_in_process(spark, "snapshot", job)
    checked = assert_every_commit_matches(tables["source"], tables["target"], AGGREGATE_QUERY, APP_ID,
                                          key=["customer_id"])
    assert checked == 1


def test_random_kills_never_corrupt_the_mv(spark, tmp_path, live_upstream):
    tables = live_upstream
    job = write_job(tmp_path, tables, LAG_THRESHOLD)
    rng = random.Random(2024)
    snapshot_in_process(spark, job)
    for _ in range(3):
        process = subprocess.Popen(spark_submit("catch_up", "--job", str(job)), env=submit_env(),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        time.sleep(rng.uniform(2.0, 9.0))
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    rerun_in_process(spark, "catch_up", job)
    watermark = DeltaTable(tables["target"]).transaction_version(APP_ID)
    assert watermark is not None
    assert_every_commit_matches(tables["source"], tables["target"], QUERY, APP_ID, key=["order_id"])


def test_catch_up_killed_on_s3_is_recovered_once_its_lease_expires(spark, tmp_path, s3_tables, monkeypatch):
    """On S3 the writer lock is a lease: the killed run's lease blocks a rerun until it
    expires (no process is left to renew it), then the rerun recovers as locally."""
    monkeypatch.setenv("AIRFLOW_BACKFILL_LEASE_SECONDS", "8")
    create_orders_table(s3_tables["source"], rows=1000, seed=3)
    job = write_job(tmp_path, s3_tables)
    snapshot_in_process(spark, job)
    rng = random.Random(3)
    for _ in range(3):
        commit_epoch(s3_tables["source"], rng, inserts=20, updates=30, deletes=10)
    crashed = run_phase("catch_up", job, "catch_up:after_write")
    assert killed(crashed), crashed.stdout[-2000:]
    # Three commits within a second: Delta would warn about their S3 timestamps (quieted).
    output = crashed.stdout + crashed.stderr
    assert output.count(TIMESTAMP_WARNING) == 0, f"{output.count(TIMESTAMP_WARNING)} timestamp warnings:\n{output[-3000:]}"
    assert read_watermark(s3_tables["target"], APP_ID) == 0, "the killed round committed"
    lease = s3_tables["target"] + "/_airflow_backfill/writer.lease"
    holder = json.loads(files.read_text(lease) or "{}")
    if holder["expires_at"] - time.time() > 0.5:  # a rerun now is refused (taking the lease is milliseconds)
        with pytest.raises(TargetError, match="lease valid for"):
            with writer_lock(s3_tables["target"], "orders_e2e", "catch_up"):
                pass
    time.sleep(max(0.0, holder["expires_at"] - time.time()) + 0.5)
    rerun_in_process(spark, "catch_up", job)
    assert read_watermark(s3_tables["target"], APP_ID) == 3
    assert_every_commit_matches(s3_tables["source"], s3_tables["target"], QUERY, APP_ID, key=["order_id"])
