"""Pause and resume: `alter --rate-limit 0` holds snapshot and catch-up at their next safe
point without losing progress; any other rate limit (or a reset) lets them continue."""

from __future__ import annotations

import logging
import random
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
import yaml
from deltalake import write_deltalake

from airflow_backfill.cli import main
from airflow_backfill.engine import job_state
from airflow_backfill.engine.control import (
    control_path,
    effective_settings,
    is_paused,
    read_overrides,
    reset_overrides,
    resume_overrides,
    wait_while_paused,
    write_overrides,
)
from airflow_backfill.engine.delta.log import read_watermark
from airflow_backfill.engine.phases.catch_up import run_catch_up
from airflow_backfill.engine.phases.snapshot import run_snapshot
from airflow_backfill.engine.snapshot_chunks.progress import load_progress
from airflow_backfill.exceptions import BackfillConfigError
from airflow_backfill.job import BackfillJob, load_job
from airflow_backfill.overrides import validate_overrides
from airflow_backfill.simulator import commit_epoch, create_orders_table
from oracle import assert_mv_matches


@pytest.fixture
def job_file(tmp_path: Path, tables: dict[str, str]) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({
        "name": "orders_mv", "query": "SELECT order_id, amount FROM source", "primary_key": ["order_id"],
        "backfill_parallelism": 2, "parallelism": 1, "rate_limit": 500, "poll_interval": 0.05, **tables,
    }))
    return path


def wait_for(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def test_alter_rate_limit_0_pauses_and_says_so(job_file, capsys):
    assert main(["alter", "--job", str(job_file), "--rate-limit", "0"]) == 0
    assert "rate_limit=500 rows/s -> backfill_parallelism=2, rate_limit=0 (paused)" in capsys.readouterr().out
    job = load_job(job_file)
    assert is_paused(job.target)
    assert effective_settings(job).paused
    assert main(["alter", "--job", str(job_file), "--reset"]) == 0
    assert not is_paused(job.target)


@pytest.mark.parametrize(("before", "after"), [
    ({}, {}),                                                     # the job's own rate limit
    ({"rate_limit": 40}, {"rate_limit": 40}),                     # an earlier override
    ({"rate_limit": None}, {"rate_limit": None}),                 # an earlier "no cap"
    ({"backfill_parallelism": 3}, {"backfill_parallelism": 3}),   # other overrides stay
])
def test_resume_brings_back_the_rate_limit_the_pause_replaced(job_file, before, after):
    job = load_job(job_file)
    if before:
        write_overrides(job.target, **before)
    write_overrides(job.target, rate_limit=0)
    write_overrides(job.target, rate_limit=0)  # a second pause keeps the first one's memory
    write_overrides(job.target, max_round_epochs=5)  # so does any other alter while paused
    assert is_paused(job.target)
    resume_overrides(job.target)
    assert read_overrides(job.target) == {**after, "max_round_epochs": 5}
    assert effective_settings(job).rate_limit == after.get("rate_limit", 500)


def test_resume_of_a_job_that_is_not_paused_is_refused_and_writes_nothing(job_file, capsys):
    job = load_job(job_file)
    with pytest.raises(BackfillConfigError, match="not paused"):
        resume_overrides(job.target)
    assert main(["alter", "--job", str(job_file), "--resume"]) == 2
    assert "nothing to resume" in capsys.readouterr().err
    assert read_overrides(job.target) == {}
    write_overrides(job.target, rate_limit=0)
    write_overrides(job.target, rate_limit=70)  # a new rate limit replaces the pause and its memory
    with pytest.raises(BackfillConfigError, match="not paused"):
        resume_overrides(job.target)
    assert read_overrides(job.target) == {"rate_limit": 70}


def test_resume_from_the_command_line_removes_the_pause_file(job_file, capsys):
    job = load_job(job_file)
    assert main(["alter", "--job", str(job_file), "--rate-limit", "0"]) == 0
    assert main(["alter", "--job", str(job_file), "--resume"]) == 0
    assert "resumed: backfill_parallelism=2, rate_limit=0 (paused) -> backfill_parallelism=2, rate_limit=500 rows/s" \
        in capsys.readouterr().out
    assert not Path(control_path(job.target)).exists()


@pytest.mark.parametrize("where", ["job", "conf"])
def test_a_job_cannot_start_paused(job_file, where):
    """0 is only an `alter`: as an initial value it is almost surely a mistake."""
    with pytest.raises(BackfillConfigError, match="rate_limit"):
        if where == "job":
            load_job(job_file).with_overrides(rate_limit=0)
        else:
            validate_overrides({"rate_limit": 0})


def test_not_paused_returns_at_once(job_file):
    job = load_job(job_file)
    assert wait_while_paused(job, poll_interval=10) == 0.0
    assert "paused_since" not in job_state.read_state(job.target)


def test_waits_until_the_rate_limit_is_altered_and_logs_once(job_file, caplog):
    job = load_job(job_file)
    write_overrides(job.target, rate_limit=0)
    held: list[float] = []
    caplog.set_level(logging.INFO, logger="airflow_backfill.engine.control")
    waiter = threading.Thread(target=lambda: held.append(wait_while_paused(job)))
    waiter.start()
    wait_for(lambda: job_state.read_state(job.target).get("paused_since") is not None)
    time.sleep(0.3)  # several polls
    assert waiter.is_alive()
    write_overrides(job.target, rate_limit=100)
    waiter.join(10)
    assert not waiter.is_alive() and held[0] >= 0.3
    assert job_state.read_state(job.target)["paused_since"] is None
    paused_lines = [r for r in caplog.records if "paused (rate limit 0)" in r.getMessage()]
    assert len(paused_lines) == 1


def test_a_reset_resumes_and_a_stop_event_ends_the_wait(job_file):
    job = load_job(job_file)
    write_overrides(job.target, rate_limit=0)
    stop = threading.Event()
    waiter = threading.Thread(target=wait_while_paused, args=(job,), kwargs={"stop": stop})
    waiter.start()
    time.sleep(0.2)
    stop.set()
    waiter.join(10)
    assert not waiter.is_alive() and is_paused(job.target)  # stopped, still paused
    waiter = threading.Thread(target=wait_while_paused, args=(job,))
    waiter.start()
    time.sleep(0.2)
    assert waiter.is_alive()
    reset_overrides(job.target)
    waiter.join(10)
    assert not waiter.is_alive()


def _upstream(job: BackfillJob, files: int) -> None:
    for index in range(files):
        ids = pa.array(range(index * 20, index * 20 + 20), pa.int64())
        write_deltalake(job.source, pa.table({"order_id": ids, "amount": pc.multiply(ids, 1.5)}),
                        mode="append", configuration={"delta.enableChangeDataFeed": "true"})


@pytest.mark.spark
def test_the_snapshot_holds_at_its_next_chunk_and_keeps_its_progress(spark, job_file):
    job = load_job(job_file).with_overrides(rate_limit=None)
    _upstream(job, 3)
    write_overrides(job.target, rate_limit=0)
    errors: list[BaseException] = []

    def snapshot() -> None:
        try:
            run_snapshot(spark, job, chunk_bytes=1)
        except BaseException as error:  # surfaced in the test thread
            errors.append(error)

    runner = threading.Thread(target=snapshot)
    runner.start()
    wait_for(lambda: job_state.read_state(job.target).get("paused_since") is not None)
    time.sleep(0.5)
    progress = load_progress(job.target)
    assert progress is not None and len(progress.done) == 0 and runner.is_alive()
    assert read_watermark(job.target, job.app_id) is None
    write_overrides(job.target, rate_limit=None)
    runner.join(120)
    assert not errors and not runner.is_alive()
    assert read_watermark(job.target, job.app_id) is not None
    progress = load_progress(job.target)
    assert progress is not None and len(progress.done) == 3
    assert progress.bytes_done == progress.bytes_total and progress.bytes_total


@pytest.mark.spark
def test_catch_up_holds_before_its_next_round_and_then_converges(spark, tables):
    query = "SELECT order_id, status, amount FROM source"
    create_orders_table(tables["source"], rows=100, seed=7)
    job = BackfillJob(name="paused_mv", query=query, primary_key=["order_id"], lag_threshold=0,
                      poll_interval=0.05, **tables)
    snapshot = run_snapshot(spark, job)
    rng = random.Random(7)
    for _ in range(3):
        commit_epoch(job.source, rng, inserts=5, updates=5, deletes=2)
    write_overrides(job.target, rate_limit=0)
    errors: list[BaseException] = []

    def catch_up() -> None:
        try:
            run_catch_up(spark, job)
        except BaseException as error:  # surfaced in the test thread
            errors.append(error)

    runner = threading.Thread(target=catch_up)
    runner.start()
    wait_for(lambda: job_state.read_state(job.target).get("paused_since") is not None)
    time.sleep(0.5)
    assert runner.is_alive() and read_watermark(job.target, job.app_id) == snapshot.epoch
    assert not job_state.read_state(job.target).get("catch_up_rounds")
    reset_overrides(job.target)
    runner.join(120)
    assert not errors and not runner.is_alive()
    assert assert_mv_matches(job.source, job.target, query, job.app_id, key=["order_id"]) == snapshot.epoch + 3
