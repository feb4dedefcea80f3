"""The three phases against an upstream that keeps committing, checked after every MV
commit against the query recomputed independently (DuckDB) at the commit's watermark."""

from __future__ import annotations

import threading
import time

import pytest
from deltalake import DeltaTable
from helpers_delta import mv_commits

from airflow_backfill.engine.phases.catch_up import run_catch_up
from airflow_backfill.engine.phases.forward import ForwardBounds, run_forward
from airflow_backfill.engine.phases.snapshot import run_snapshot
from airflow_backfill.engine.rounds import feed as round_feed
from airflow_backfill.job import BackfillJob
from airflow_backfill.simulator import create_orders_table, run_simulator
from oracle import assert_every_commit_matches

pytestmark = pytest.mark.spark

QUERY = (
    "SELECT order_id AS id, customer_id, upper(status) AS status, amount * quantity AS total, "
    "updated_at FROM source WHERE status <> 'cancelled' AND quantity > 1"
)


def make_job(tables: dict[str, str], **overrides) -> BackfillJob:
    fields = dict(
        name="orders_mv", query=QUERY, primary_key=["order_id"],
        backfill_parallelism=2, parallelism=1, lag_threshold=0, poll_interval=0.2,
    )
    return BackfillJob(**tables, **{**fields, **overrides})


def wait_for_version(uri: str, version: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while DeltaTable(uri).version() < version:
        assert time.monotonic() < deadline, f"the upstream did not reach version {version}"
        time.sleep(0.05)


# `listed`: feeds too large for the driver, read by Spark from the files their logs list
@pytest.mark.parametrize("feeds", ["driver", "listed"])
def test_three_phases_under_concurrent_upstream_writes(spark, tables, monkeypatch, feeds):
    listed: list[bool] = []  # per round that asked: whether the range was read from listed files
    if feeds == "listed":
        monkeypatch.setattr(round_feed, "feed_in_driver", lambda *args, **kwargs: None)
        read_listed = round_feed.listed_feed

        def recorded(*args):
            found = read_listed(*args)
            listed.append(found is not None)
            return found

        monkeypatch.setattr(round_feed, "listed_feed", recorded)
    create_orders_table(tables["source"], rows=3000, seed=7)
    job = make_job(tables)
    stop = threading.Event()
    writer = threading.Thread(
        target=run_simulator,
        kwargs=dict(uri=tables["source"], rows=3000, epoch_interval=0.3, inserts=40, updates=60,
                    deletes=20, seed=11, stop_event=stop),
        daemon=True,
    )
    writer.start()
    try:
        snapshot = run_snapshot(spark, job)
        # A warm session can snapshot faster than one upstream epoch: make sure the
        # upstream moved past the pinned epoch, so catch-up has rounds to run.
        wait_for_version(tables["source"], snapshot.epoch + 1)
        caught_up = run_catch_up(spark, job)
        forward = run_forward(spark, job, bounds=ForwardBounds(max_epochs=3, idle_timeout=30))
    finally:
        stop.set()
        writer.join(timeout=30)

    upstream_latest = DeltaTable(tables["source"]).version()
    assert snapshot.skipped is False
    assert caught_up.watermark >= snapshot.epoch
    assert forward.watermark >= forward.start_watermark + 3
    assert upstream_latest >= forward.watermark

    commits = mv_commits(tables["target"])
    phases = [c["airflow_backfill.phase"] for c in commits]
    assert phases[0] == "snapshot" and "catch_up" in phases and phases[-1] == "forward"
    epochs = [int(c["airflow_backfill.epoch"]) for c in commits]
    assert epochs == sorted(epochs), "the watermark moved backwards"
    for commit in commits:
        expected = 1 if commit["airflow_backfill.phase"] == "forward" else 2
        assert int(commit["airflow_backfill.parallelism"]) == expected

    checked = assert_every_commit_matches(
        tables["source"], tables["target"], QUERY, job.app_id, key=["id"]
    )
    assert checked == len(commits)
    assert any(listed) == (feeds == "listed")


def test_rerunning_committed_phases_is_a_no_op(spark, tables):
    create_orders_table(tables["source"], rows=500, seed=3)
    job = make_job(tables)
    first = run_snapshot(spark, job)
    version_after_snapshot = DeltaTable(tables["target"]).version()

    again = run_snapshot(spark, job)
    assert again.skipped and again.epoch == first.epoch
    caught_up = run_catch_up(spark, job)
    assert caught_up.rounds == []
    assert DeltaTable(tables["target"]).version() == version_after_snapshot
