"""The rate limit: snapshot and catch-up throughput (rows processed / wall time of the
phase) stays within 10% over the cap, the cap actually shaped the phase (without it the
phase would have been faster), and an `alter` of the cap applies from the next round."""

from __future__ import annotations

import random
import time

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import write_deltalake

from airflow_backfill.engine.control import write_overrides
from airflow_backfill.engine.phases import rounds as rounds_module
from airflow_backfill.engine.phases.catch_up import run_catch_up
from airflow_backfill.engine.phases.snapshot import run_snapshot
from airflow_backfill.engine.rate_limit import pace
from airflow_backfill.engine.snapshot_chunks.progress import load_progress
from airflow_backfill.job import BackfillJob
from airflow_backfill.simulator import commit_epoch, create_orders_table
from oracle import assert_mv_matches

pytestmark = pytest.mark.spark

TOLERANCE = 1.10
"""Measured throughput may exceed the cap by at most 10%."""


def test_pace_waits_for_the_rest_of_the_rounds_budget():
    slept: list[float] = []
    assert pace(1000, 0.25, 2000, sleep=slept.append) == pytest.approx(0.25)
    assert pace(1000, 0.75, 2000, sleep=slept.append) == 0.0  # already slower than the cap
    assert pace(1000, 0.1, None, sleep=slept.append) == 0.0
    assert pace(0, 0.0, 10, sleep=slept.append) == 0.0
    assert slept == [pytest.approx(0.25)]


def upstream_with_files(path: str, files: int, rows_per_file: int) -> None:
    for index in range(files):
        ids = pa.array(range(index * rows_per_file, (index + 1) * rows_per_file), pa.int64())
        write_deltalake(path, pa.table({"order_id": ids, "amount": pc.multiply(ids, 0.5)}),
                        mode="append", configuration={"delta.enableChangeDataFeed": "true"})


@pytest.fixture(scope="module")
def warm_spark(spark, tmp_path_factory):
    """The session after one small unpaced snapshot and catch-up round, so that JVM warm-up
    (seconds on a cold session) is not mistaken for pacing in the measurements."""
    root = tmp_path_factory.mktemp("warm")
    job = BackfillJob(name="warm", query="SELECT order_id, amount FROM source", primary_key=["order_id"],
                      source=str(root / "source"), target=str(root / "target"))
    create_orders_table(job.source, rows=50, seed=1)
    run_snapshot(spark, job)
    commit_epoch(job.source, random.Random(1), inserts=20, updates=20, deletes=5)
    run_catch_up(spark, job)
    return spark


SNAPSHOT_QUERY = "SELECT order_id, amount * 2 AS doubled FROM source"


def test_snapshot_throughput_stays_under_the_cap(warm_spark, tables):
    spark = warm_spark
    files, rows_per_file, rate_limit = 3, 10_000, 2_000  # 5 s per chunk: above its Delta append, even on a busy machine
    upstream_with_files(tables["source"], files, rows_per_file)
    job = BackfillJob(name="paced", query=SNAPSHOT_QUERY, primary_key=["order_id"], **tables,
                      rate_limit=rate_limit)

    started = time.monotonic()
    result = run_snapshot(spark, job, chunk_bytes=1)
    wall = time.monotonic() - started

    progress = load_progress(job.target)
    assert progress is not None and result.chunks_run == files == progress.chunks_total
    throughput = progress.rows_total / wall
    work = sum(chunk.seconds for chunk in progress.done.values())  # chunk time before pausing
    print(f"snapshot: {progress.rows_total} rows in {wall:.2f}s = {throughput:.0f} rows/s "
          f"(cap {rate_limit}, unpaced chunks {progress.rows_total / work:.0f} rows/s)")
    assert throughput <= rate_limit * TOLERANCE
    assert progress.rows_total / work > rate_limit, "the cap never bound: the test proves nothing"
    assert_mv_matches(job.source, job.target, SNAPSHOT_QUERY, job.app_id, key=["order_id"])


def test_catch_up_throughput_stays_under_the_cap_and_follows_an_alter(warm_spark, tables, monkeypatch):
    spark = warm_spark
    create_orders_table(tables["source"], rows=200, seed=3)
    rng = random.Random(3)
    epoch = {"inserts": 500, "updates": 400, "deletes": 10}
    first_cap, second_cap = 200, 120  # about 7 - 11 s per round: well above a warm round's MERGE, even on a busy machine
    query = "SELECT order_id, status, amount FROM source WHERE status <> 'cancelled'"
    job = BackfillJob(name="paced", query=query, primary_key=["order_id"], **tables,
                      rate_limit=first_cap, lag_threshold=0)
    run_snapshot(spark, job)
    for _ in range(2):
        commit_epoch(job.source, rng, **epoch)

    real_latest_version = rounds_module.latest_version
    checks = 0

    def latest_version_after_an_epoch_and_an_alter(uri: str) -> int:
        nonlocal checks
        checks += 1
        if checks == 2:  # between rounds 1 and 2: one more epoch arrives, the operator halves the cap
            commit_epoch(job.source, rng, **epoch)
            write_overrides(job.target, rate_limit=second_cap)
        return real_latest_version(uri)

    monkeypatch.setattr(rounds_module, "latest_version", latest_version_after_an_epoch_and_an_alter)
    started = time.monotonic()
    result = run_catch_up(spark, job)
    wall = time.monotonic() - started

    assert [r.rate_limit for r in result.rounds] == [first_cap, second_cap]
    total_rows = sum(r.change_rows for r in result.rounds)
    throughput = total_rows / wall
    print(f"catch-up: {total_rows} change rows in {wall:.2f}s = {throughput:.0f} rows/s; rounds: "
          + ", ".join(f"{r.change_rows} rows in {r.seconds}s (paused {r.paused_seconds}s, cap {r.rate_limit})"
                      for r in result.rounds))
    for r in result.rounds:
        assert r.change_rows / r.seconds <= r.rate_limit * TOLERANCE
    assert throughput <= first_cap * TOLERANCE
    assert sum(r.paused_seconds for r in result.rounds) > 0, "the cap never bound: the test proves nothing"
    assert_mv_matches(job.source, job.target, query, job.app_id, key=["order_id"])
