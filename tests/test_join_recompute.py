"""A join MV recomputed at its round's vector instead of applying the round's changes:
every MV commit still equals the query over each upstream as of its recorded version,
kills at the recompute's fault points are recovered (between an aggregate's state and MV
commits too: tests/test_join_recovery.py), a repeated MV key is refused before
anything is written, and `auto` chooses it only when the join's snapshot says it is
cheaper than the least a round of its changes costs."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from helpers_delta import mv_commits
from join_upstreams import create_all, random_epoch
from test_join_recovery import STATELESS, killed_at_each_point_then_rerun, uris
from test_joins import join_job, run_scenario

import airflow_backfill.engine.joins.recompute as recompute_module
from airflow_backfill.engine import job_state
from airflow_backfill.engine.delta.key_range import table_rows
from airflow_backfill.engine.feed_readers import recorded_feed_readers
from airflow_backfill.engine.phases.catch_up import run_catch_up
from airflow_backfill.engine.phases.snapshot import run_snapshot
from airflow_backfill.engine.planning.round_plan import JOIN_ROUND, RECOMPUTE
from airflow_backfill.engine.rounds.plan_choice import (
    ROUND_COSTS,
    SNAPSHOT_PARALLELISM,
    SNAPSHOT_UPSTREAM_ROWS,
    join_recompute_first,
)
from airflow_backfill.exceptions import UpstreamError
from oracle import assert_every_join_commit_matches


@pytest.mark.spark
@pytest.mark.parametrize("shape", ["left_chain_of_four", "aggregate_over_inner"])
def test_a_join_recomputed_every_round_matches_at_every_commit(spark, tmp_path, shape):
    plans = run_scenario(spark, tmp_path, shape, round_plan="recompute")  # checks every commit
    assert [plan["plan"] for plan in plans] == [RECOMPUTE, RECOMPUTE], plans


@pytest.mark.spark
def test_a_recompute_killed_at_each_fault_point_is_redone_once(spark, tmp_path, monkeypatch):
    tables = create_all(str(tmp_path), seed=31)
    rng = random.Random(31)
    job = join_job(tables, str(tmp_path / "mv"), STATELESS, round_plan="recompute")
    run_snapshot(spark, job)
    assert recorded_feed_readers(job.target) == ["delta-spark"]  # a join's MV is created with its readers too
    killed_at_each_point_then_rerun(spark, job, tables, rng, monkeypatch, recompute_module,
                                    lambda: run_catch_up(spark, job))
    phases = [commit["airflow_backfill.phase"] for commit in mv_commits(job.target)]
    assert phases == ["snapshot", "catch_up", "catch_up"], "a killed recompute was lost or committed twice"
    vectors = assert_every_join_commit_matches(uris(tables), job.target, STATELESS, job.app_id,
                                               key=["i_order", "i_line"])
    assert vectors[-1] == {name: table.version() for name, table in tables.items()}


@pytest.mark.spark
def test_a_recompute_refuses_a_repeated_mv_key_before_writing(spark, tmp_path):
    tables = create_all(str(tmp_path), seed=33, names=("orders", "items"))
    query = "SELECT i.i_order, i.i_line, o.o_status FROM items i JOIN orders o ON i.i_order = o.o_id"
    job = join_job(tables, str(tmp_path / "mv"), query, round_plan="recompute")
    run_snapshot(spark, job)
    orders = tables["orders"]
    joined = next(row for row in orders.rows.values()
                  if any(item["i_order"] == row["o_id"] for item in tables["items"].rows.values()))
    write_deltalake(orders.uri, pa.Table.from_pylist([{**joined, "o_status": "again"}], schema=orders.schema),
                    mode="append")
    before = len(mv_commits(job.target))
    with pytest.raises(UpstreamError, match=r"the join holds MV key i_order=\d+, i_line=\d+ 2 times at versions"):
        run_catch_up(spark, job)
    assert len(mv_commits(job.target)) == before


def _moved(tmp_path, seed: int):
    """Two tiny upstreams that moved one epoch each since `watermark`."""
    tables = create_all(str(tmp_path), seed=seed, names=("orders", "items"))
    watermark = {name: table.version() for name, table in tables.items()}
    rng = random.Random(seed)
    for table in tables.values():
        random_epoch(table, rng)
    return tables, watermark, {name: table.version() for name, table in tables.items()}


def _snapshot_took(job, tables, seconds: float) -> None:
    rows = {name: table_rows(table.uri, 0) for name, table in tables.items()}
    job_state.update_state(job.target, snapshot_seconds=seconds, **{SNAPSHOT_UPSTREAM_ROWS: rows,
                                                                     SNAPSHOT_PARALLELISM: 2})


def test_auto_recomputes_a_join_only_when_its_measured_snapshot_beats_its_rounds(tmp_path):
    tables, watermark, target = _moved(tmp_path, 34)
    job = join_job(tables, str(tmp_path / "mv"), STATELESS.split(" LEFT JOIN")[0], round_plan="auto")

    def decide(**overrides):
        plan, least = join_recompute_first(job.with_overrides(**overrides) if overrides else job, watermark, target,
                                           2, aggregate=False, prove_key=True)
        assert least > 0
        return plan

    _snapshot_took(job, tables, 0.05)  # a quick snapshot: recomputing beats a round's fixed cost
    chosen = decide()
    assert chosen is not None and chosen.plan == RECOMPUTE
    assert chosen.estimates[RECOMPUTE] < chosen.estimates["incremental"] - 1.0
    assert decide(round_plan="incremental") is None and decide(round_plan="merge") is None
    _snapshot_took(job, tables, 60.0)  # a slow one: the rounds win
    assert decide() is None
    assert decide(round_plan="recompute").plan == RECOMPUTE  # asked for, whatever it costs

    _snapshot_took(job, tables, 0.05)  # rounds measured far below their estimate win too
    job_state.update_state(job.target, **{ROUND_COSTS: [
        {"plan": JOIN_ROUND, "estimate_s": 3.0, "seconds": 0.6, "epoch": n} for n in range(3)]})
    assert decide() is None
