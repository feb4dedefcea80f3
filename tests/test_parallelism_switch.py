"""The parallelism switch: snapshot and catch-up commit at the backfill parallelism (an
`alter` override from its next round), forward at the normal parallelism; every MV commit
records the parallelism it ran at."""

from __future__ import annotations

import random

import pytest
import yaml
from helpers_delta import mv_commits

from airflow_backfill.cli import main as cli_main
from airflow_backfill.engine import job_state
from airflow_backfill.engine.control import write_overrides
from airflow_backfill.engine.parallelism import spark_conf_for
from airflow_backfill.engine.phases import rounds as rounds_module
from airflow_backfill.engine.phases.catch_up import run_catch_up
from airflow_backfill.engine.phases.forward import ForwardBounds, run_forward
from airflow_backfill.engine.phases.snapshot import run_snapshot
from airflow_backfill.engine.snapshot_chunks import run as snapshot_module
from airflow_backfill.job import BackfillJob, load_job
from airflow_backfill.simulator import commit_epoch, create_orders_table
from oracle import assert_every_commit_matches

pytestmark = pytest.mark.spark

QUERY = "SELECT order_id, status, amount * quantity AS total FROM source WHERE quantity > 2"
BACKFILL_PARALLELISM, ALTERED_PARALLELISM, PARALLELISM = 3, 4, 1
EPOCH = {"inserts": 20, "updates": 30, "deletes": 5}


def test_the_session_is_built_from_the_parallelism_mapping(spark):
    # conftest builds the shared session with build_spark_session(..., parallelism=2).
    expected = spark_conf_for(2, "local[*]")
    assert spark.sparkContext.master == expected["spark.master"]
    assert str(spark.sparkContext.defaultParallelism) == expected["spark.default.parallelism"]


def test_commits_before_the_hand_over_use_the_backfill_parallelism(spark, tables, monkeypatch):
    create_orders_table(tables["source"], rows=1500, seed=21)
    rng = random.Random(21)
    job = BackfillJob(name="switch", query=QUERY, primary_key=["order_id"], **tables,
                      backfill_parallelism=BACKFILL_PARALLELISM, parallelism=PARALLELISM, lag_threshold=0)

    real_apply = rounds_module.apply_epochs
    round_parallelisms: list[int] = []

    def round_with_live_upstream_and_alter(*args, **kwargs):
        applied = real_apply(*args, **kwargs)
        if kwargs["phase"] != "catch_up":  # forward's rounds go through the same function
            return applied
        round_parallelisms.append(kwargs["parallelism"])
        if len(round_parallelisms) == 1:  # during round 1: a new epoch arrives, an operator alters
            commit_epoch(tables["source"], rng, **EPOCH)
            write_overrides(job.target, backfill_parallelism=ALTERED_PARALLELISM)
        return applied

    monkeypatch.setattr(rounds_module, "apply_epochs", round_with_live_upstream_and_alter)

    snapshot = run_snapshot(spark, job)
    for _ in range(3):
        commit_epoch(tables["source"], rng, **EPOCH)
    caught_up = run_catch_up(spark, job)
    for _ in range(2):
        commit_epoch(tables["source"], rng, **EPOCH)
    forward = run_forward(spark, job, bounds=ForwardBounds(max_epochs=2, idle_timeout=30))
    commit_epoch(tables["source"], rng, **EPOCH)
    forward_again = run_forward(spark, job, bounds=ForwardBounds(max_epochs=1, idle_timeout=30))

    assert caught_up.converged and len(caught_up.rounds) == 2
    assert round_parallelisms == [BACKFILL_PARALLELISM, ALTERED_PARALLELISM]
    assert [r.parallelism for r in caught_up.rounds] == round_parallelisms
    recorded = job_state.read_state(job.target)["catch_up_rounds"]
    assert [r["parallelism"] for r in recorded] == round_parallelisms
    assert forward.commits == 1 and forward_again.commits == 1

    commits = mv_commits(job.target)
    phases = [c["airflow_backfill.phase"] for c in commits]
    hand_over = phases.index("forward")
    assert phases[:hand_over] == ["snapshot", "catch_up", "catch_up"]
    assert set(phases[hand_over:]) == {"forward"} and len(phases) - hand_over == 2
    used = [int(c["airflow_backfill.parallelism"]) for c in commits]
    assert used[:hand_over] == [BACKFILL_PARALLELISM, *round_parallelisms]
    assert used[hand_over:] == [PARALLELISM] * 2, "forward must ignore the backfill override"
    assert spark.conf.get("spark.sql.shuffle.partitions") == str(PARALLELISM)
    assert int(commits[0]["airflow_backfill.epoch"]) == snapshot.epoch

    checked = assert_every_commit_matches(job.source, job.target, QUERY, job.app_id, key=["order_id"])
    assert checked == len(commits)


def test_an_alter_mid_snapshot_through_the_cli_shows_in_every_later_commit(spark, tables, tmp_path, monkeypatch):
    """backfill_parallelism 2 and parallelism 1; `airflow-backfill alter` sets the backfill
    parallelism to 1 after the snapshot's second chunk: the chunks after it, the catch-up
    rounds and forward all commit at 1, and the snapshot commit records the switch."""
    create_orders_table(tables["source"], rows=400, seed=31)
    rng = random.Random(31)
    for _ in range(3):  # insert-only epochs: one more upstream file, so one more chunk, each
        commit_epoch(tables["source"], rng, inserts=100, updates=0, deletes=0)
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump({
        "name": "alter_mid_snapshot", "query": QUERY, "primary_key": ["order_id"], **tables,
        "backfill_parallelism": 2, "parallelism": 1, "lag_threshold": 0,
    }))
    job = load_job(job_file)

    def alter_after_second_chunk(phase: str, at: str) -> None:
        if at == "after_chunks=2":
            assert cli_main(["alter", "--job", str(job_file), "--backfill-parallelism", "1"]) == 0

    monkeypatch.setattr(snapshot_module, "maybe_crash", alter_after_second_chunk)
    run_snapshot(spark, job, chunk_bytes=1)
    monkeypatch.undo()
    commit_epoch(tables["source"], rng, **EPOCH)
    run_catch_up(spark, job)
    commit_epoch(tables["source"], rng, **EPOCH)
    run_forward(spark, job, bounds=ForwardBounds(max_epochs=1, idle_timeout=30))

    commits = mv_commits(job.target)
    phases = [c["airflow_backfill.phase"] for c in commits]
    assert phases == ["snapshot", "catch_up", "forward"]
    chunks = commits[0]["airflow_backfill.chunk_parallelism"].split(",")
    assert len(chunks) == 4 and chunks == ["2", "2", "1", "1"]
    assert [int(c["airflow_backfill.parallelism"]) for c in commits] == [1, 1, 1]
    assert assert_every_commit_matches(job.source, job.target, QUERY, job.app_id, key=["order_id"]) == 3
