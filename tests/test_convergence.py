"""Catch-up convergence: each round covers every epoch pending at its start, so the lag
recorded per round never grows while the upstream commits more slowly than catch-up
applies; when the upstream is faster, catch-up hands over after `max_stalled_rounds`
with a warning, and nothing is lost."""

from __future__ import annotations

import logging
import math
import random
import threading
import time

import pytest
import yaml
from deltalake import DeltaTable

from airflow_backfill.engine import job_state
from airflow_backfill.engine.phases import rounds as rounds_module
from airflow_backfill.engine.phases.catch_up import run_catch_up
from airflow_backfill.engine.phases.forward import ForwardBounds, run_forward
from airflow_backfill.engine.phases.snapshot import run_snapshot
from airflow_backfill.exceptions import BackfillConfigError
from airflow_backfill.job import DEFAULT_MAX_STALLED_ROUNDS, BackfillJob, load_job
from airflow_backfill.simulator import commit_epoch, create_orders_table, run_simulator
from oracle import assert_mv_matches

CATCH_UP_LOG = "airflow_backfill.engine.phases.catch_up"
"""The logger of catch-up's warnings (the rounds it drives are in `phases/rounds.py`)."""

QUERY = "SELECT order_id, customer_id, status, amount * quantity AS total FROM source WHERE status <> 'paid'"
EPOCH = {"inserts": 15, "updates": 25, "deletes": 5}
KEY = ["order_id"]


def make_job(tables: dict[str, str], **fields) -> BackfillJob:
    return BackfillJob(name="converge", query=QUERY, primary_key=KEY, **tables, **fields)


def recorded_rounds(job: BackfillJob) -> list[dict]:
    return job_state.read_state(job.target)["catch_up_rounds"]


def upstream_commits_between_rounds(monkeypatch, job: BackfillJob, rng: random.Random, epochs_after) -> list[int]:
    """Before every round after the first, commit `epochs_after(previous round's pending)`
    upstream epochs (they arrive while catch-up works). Returns the arrivals, round by round."""
    real_latest_version = rounds_module.latest_version
    arrivals: list[int] = []

    def latest_version(uri: str) -> int:
        rounds = job_state.read_state(job.target).get("catch_up_rounds") or []
        if len(rounds) > len(arrivals):  # a round finished since the last check
            arrivals.append(epochs_after(rounds[-1]["pending_epochs"]))
            for _ in range(arrivals[-1]):
                commit_epoch(job.source, rng, **EPOCH)
        return real_latest_version(uri)

    monkeypatch.setattr(rounds_module, "latest_version", latest_version)
    return arrivals


def assert_never_grows(pending: list[int]) -> None:
    growth = [(i + 1, a, b) for i, (a, b) in enumerate(zip(pending, pending[1:], strict=False)) if b > a]
    assert not growth, f"the lag grew between rounds (round, before, after): {growth}; all: {pending}"


# ---- the job field ----------------------------------------------------------------------


def test_max_stalled_rounds_defaults_and_loads_from_a_job_file(tables, tmp_path):
    assert make_job(tables).max_stalled_rounds == DEFAULT_MAX_STALLED_ROUNDS
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"name": "converge", "query": QUERY, "primary_key": KEY, **tables,
                                    "max_stalled_rounds": 7}))
    job = load_job(path)
    assert job.max_stalled_rounds == 7
    assert BackfillJob.from_mapping(job.to_mapping()) == job


@pytest.mark.parametrize(("value", "message"), [
    (0, "max_stalled_rounds must be between 1 and 1000, got 0"),
    (-2, "max_stalled_rounds must be between 1 and 1000, got -2"),
    (1001, "max_stalled_rounds must be between 1 and 1000, got 1001"),
    ("3", "max_stalled_rounds must be an integer between 1 and 1000, got '3'"),
    (True, "max_stalled_rounds must be an integer"),
    (2.5, "max_stalled_rounds must be an integer"),
])
def test_invalid_max_stalled_rounds_is_refused(tables, value, message):
    with pytest.raises(BackfillConfigError) as caught:
        BackfillJob.from_mapping({"name": "converge", "query": QUERY, "primary_key": KEY, **tables,
                                  "max_stalled_rounds": value}, origin="job file j.yaml")
    assert str(caught.value).startswith("job file j.yaml: ") and message in str(caught.value)


# ---- convergence ------------------------------------------------------------------------


@pytest.mark.spark
def test_the_lag_shrinks_every_round_while_the_upstream_keeps_committing(spark, tables, monkeypatch, caplog):
    create_orders_table(tables["source"], rows=400, seed=5)
    rng = random.Random(5)
    job = make_job(tables, lag_threshold=1)
    snapshot = run_snapshot(spark, job)
    backlog = 9
    for _ in range(backlog):
        commit_epoch(job.source, rng, **EPOCH)
    # The upstream writes a third as fast as catch-up applies: a third of a round's epochs
    # arrive while it runs (rounded up, so it never stops writing).
    arrivals = upstream_commits_between_rounds(monkeypatch, job, rng, lambda applied: math.ceil(applied / 3))

    with caplog.at_level(logging.WARNING, logger=CATCH_UP_LOG):
        result = run_catch_up(spark, job)

    pending = [r["pending_epochs"] for r in recorded_rounds(job)]
    print(f"upstream at a third of catch-up's speed: pending epochs per round {pending}, then {result.pending_epochs}")
    assert pending == [r.pending_epochs for r in result.rounds]
    assert pending[0] == backlog and len(pending) >= 2 and sum(arrivals) > 0, "the upstream did not commit"
    assert pending[1:] == arrivals[: len(pending) - 1], "a round left epochs pending at its start unapplied"
    assert_never_grows(pending)
    assert result.converged and result.pending_epochs <= job.lag_threshold
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and r.name == CATCH_UP_LOG], (
        "no stall warning expected")
    assert result.watermark == snapshot.epoch + sum(pending)
    handover = job_state.read_state(job.target)["catch_up_handover_version"]
    assert handover - result.watermark == result.pending_epochs  # the lag the hand-over was decided on
    assert assert_mv_matches(job.source, job.target, QUERY, job.app_id, key=KEY) == result.watermark


@pytest.mark.spark
def test_the_lag_never_grows_with_a_live_simulator(spark, tables, caplog):
    """A real concurrent writer. Its epoch interval is longer than a warm round (a Delta MERGE
    takes a few seconds on a loaded two-core machine), so at most
    one epoch arrives per round after the first: the lag drops from the backlog to 0 or 1
    and stays there (convergence, or a hand-over if a constant 1 persists)."""
    create_orders_table(tables["source"], rows=400, seed=8)
    job = make_job(tables, lag_threshold=0)
    run_snapshot(spark, job)
    backlog, rng = 6, random.Random(8)
    for _ in range(backlog):
        commit_epoch(job.source, rng, **EPOCH)
    stop = threading.Event()
    writer = threading.Thread(target=run_simulator, kwargs=dict(
        uri=job.source, rows=400, epoch_interval=8.0, seed=9, stop_event=stop, **EPOCH,
    ), daemon=True)
    writer.start()
    try:
        with caplog.at_level(logging.WARNING, logger=CATCH_UP_LOG):
            result = run_catch_up(spark, job)
        # The upstream is still live after catch-up: it committed all along.
        deadline = time.monotonic() + 30
        while DeltaTable(job.source).version() <= result.watermark + result.pending_epochs:
            assert time.monotonic() < deadline, "the simulator stopped committing"
            time.sleep(0.2)
    finally:
        stop.set()
        writer.join(timeout=30)

    pending = [r["pending_epochs"] for r in recorded_rounds(job)]
    print(f"live simulator: pending epochs per round {pending}, then {result.pending_epochs}")
    assert pending and pending[0] >= backlog
    assert_never_grows([*pending, result.pending_epochs])
    assert result.converged or any("has not reached a new low" in r.getMessage() for r in caplog.records)
    assert assert_mv_matches(job.source, job.target, QUERY, job.app_id, key=KEY) == result.watermark


@pytest.mark.spark
def test_an_upstream_faster_than_catch_up_hands_over_after_max_stalled_rounds(spark, tables, monkeypatch, caplog):
    create_orders_table(tables["source"], rows=300, seed=6)
    rng = random.Random(6)
    job = make_job(tables, lag_threshold=0, max_stalled_rounds=2)
    run_snapshot(spark, job)
    for _ in range(2):
        commit_epoch(job.source, rng, **EPOCH)
    # The upstream writes faster than catch-up: more epochs arrive than a round applied.
    arrivals = upstream_commits_between_rounds(monkeypatch, job, rng, lambda applied: applied + 1)

    with caplog.at_level(logging.WARNING, logger=CATCH_UP_LOG):
        result = run_catch_up(spark, job)

    pending = [r.pending_epochs for r in result.rounds]
    print(f"upstream faster than catch-up: pending epochs per round {pending}, then {result.pending_epochs}")
    assert not result.converged
    assert len(result.rounds) == job.max_stalled_rounds, "stalled rounds counted wrong"
    assert pending[1:] == arrivals[: len(pending) - 1] and result.pending_epochs == arrivals[-1]
    assert result.pending_epochs > pending[-1] > pending[0]
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno >= logging.WARNING and r.name == CATCH_UP_LOG]
    assert len(warnings) == 1 and f"has not reached a new low for {job.max_stalled_rounds} rounds" in warnings[0]
    assert "nothing is lost" in warnings[0]
    state = job_state.read_state(job.target)
    assert state["catch_up_converged"] is False and state["catch_up_pending_epochs"] == result.pending_epochs
    assert state["catch_up_handover_version"] == result.watermark + result.pending_epochs

    # Nothing lost: the MV is exact at its watermark, and forward continues from there.
    assert assert_mv_matches(job.source, job.target, QUERY, job.app_id, key=KEY) == result.watermark
    latest = DeltaTable(job.source).version()
    forward = run_forward(spark, job, bounds=ForwardBounds(max_epochs=latest - result.watermark, idle_timeout=30))
    assert forward.start_watermark == result.watermark and forward.watermark == latest
    assert assert_mv_matches(job.source, job.target, QUERY, job.app_id, key=KEY) == latest
