"""Rounds through every plan: each is exact at every commit, a round killed before or after
its commit in any plan is redone exactly once, `round_plan` pins the plan, `auto`
recomputes when the job's own rounds say that is cheaper, and a recompute still refuses a
key the upstream holds twice."""

from __future__ import annotations

import json
import random

import pytest
from aggregate_upstream import apply_epoch, create, random_ops
from deltalake import DeltaTable
from helpers_delta import append_orders, cycle_write_ways, mv_commits, round_plans, unnamed_files

from airflow_backfill.engine import job_state
from airflow_backfill.engine.aggregates import apply as aggregate_apply
from airflow_backfill.engine.phases import apply
from airflow_backfill.engine.phases.catch_up import run_catch_up
from airflow_backfill.engine.phases.snapshot import run_snapshot
from airflow_backfill.engine.planning.round_plan import Rates
from airflow_backfill.engine.rounds import feed as round_feed
from airflow_backfill.engine.rounds import plan_choice
from airflow_backfill.engine.rounds.plan_choice import ROUND_COSTS
from airflow_backfill.exceptions import RepeatedKeyError
from airflow_backfill.job import BackfillJob
from airflow_backfill.simulator import commit_epoch, create_orders_table
from oracle import assert_every_commit_matches

pytestmark = pytest.mark.spark

QUERY = "SELECT order_id, customer_id, amount * quantity AS total FROM source WHERE status <> 'cancelled'"
AGGREGATE = "SELECT g, COUNT(*) AS n, SUM(x) AS sx, MIN(x) AS mn FROM source GROUP BY g"
PLANS = ("replace", "merge", "overwrite", "recompute")
CHANGES = {"replace": {"inserts": 20, "updates": 40, "deletes": 0}, "delete": {"inserts": 0, "updates": 0, "deletes": 15}}
"""A replace applies rounds whose every key has a new row, a delete rounds that only delete;
the other plans take any change."""
UNFILTERED = "SELECT order_id, customer_id, amount * quantity AS total FROM source"


class Killed(Exception):
    """Stands in for SIGKILL inside the test process."""


def kill_at(monkeypatch, module, point: str) -> None:
    def fake_crash(phase: str, at: str) -> None:
        if at == point:
            raise Killed(f"{phase}:{at}")

    monkeypatch.setattr(module, "maybe_crash", fake_crash)


def orders_job(tables: dict[str, str], query: str = QUERY, **settings) -> BackfillJob:
    return BackfillJob(name="orders_mv", query=query, primary_key=["order_id"], lag_threshold=0,
                       backfill_parallelism=1, parallelism=1, **settings, **tables)


def plan_job(tables: dict[str, str], plan: str, monkeypatch, **settings) -> BackfillJob:
    """A job whose rounds take `plan`: recompute through the job's own field, a way to write
    through the test hook (the tiny test tables would otherwise always be overwritten)."""
    if plan == "recompute":
        return orders_job(tables, round_plan="recompute", **settings)
    cycle_write_ways(monkeypatch, (plan,))
    return orders_job(tables, round_plan="incremental", **settings)


def spark_key_counts(monkeypatch) -> list:
    """The keys a round's recompute counts with Spark (over the whole upstream), recorded."""
    counted: list = []
    count_keys = apply.duplicate_key
    monkeypatch.setattr(apply, "duplicate_key", lambda rows, key: counted.append(key) or count_keys(rows, key))
    return counted


@pytest.mark.parametrize("plan", (*PLANS, "delete"))
def test_a_round_killed_before_or_after_its_commit_is_redone_once_in_every_plan(spark, tables, monkeypatch, plan):
    source = tables["source"]
    create_orders_table(source, rows=300, seed=11)
    query = UNFILTERED if plan in CHANGES else QUERY  # a filter turns updates into deletes
    job = plan_job(tables, plan, monkeypatch, query=query)
    run_snapshot(spark, job)
    commit_epoch(source, random.Random(11), **CHANGES.get(plan, {"inserts": 20, "updates": 40, "deletes": 15}))

    before = unnamed_files(job.target)
    kill_at(monkeypatch, apply, "after_write")  # the round's files written, not committed
    with pytest.raises(Killed):
        run_catch_up(spark, job)
    assert len(mv_commits(job.target)) == 1, "nothing may be committed before the commit"
    written = unnamed_files(job.target) - before
    # Delta's MERGE writes and commits in one call: it is killed just before it
    assert bool(written) == (plan != "merge"), (plan, written)
    kill_at(monkeypatch, apply, "after_commit")  # committed, then killed
    with pytest.raises(Killed):
        run_catch_up(spark, job)
    monkeypatch.setattr(apply, "maybe_crash", lambda phase, at: None)
    result = run_catch_up(spark, job)  # the rerun finds the watermark there: nothing to apply

    assert result.rounds == [] and result.watermark == DeltaTable(source).version()
    assert round_plans(job.target) == [plan]
    assert assert_every_commit_matches(source, job.target, query, job.app_id, key=["order_id"]) == 2


@pytest.mark.parametrize("plan", PLANS)
def test_an_aggregate_killed_between_its_state_and_mv_commits_recovers_in_every_plan(
        spark, tables, monkeypatch, plan):
    rng = random.Random(plan)
    upstream = create(tables["source"], [{"g": rng.choice("abc"), "h": None, "x": rng.randint(0, 9), "d": None,
                                          "f": None, "s": None} for _ in range(30)])
    job = BackfillJob(name="agg", query=AGGREGATE, primary_key=["id"], lag_threshold=0, backfill_parallelism=1,
                      parallelism=1, round_plan="recompute" if plan == "recompute" else "incremental", **tables)
    if plan != "recompute":
        monkeypatch.setattr(aggregate_apply, "_cheapest", lambda estimates: plan)
    run_snapshot(spark, job)
    apply_epoch(upstream, random_ops(rng))

    kill_at(monkeypatch, aggregate_apply, "after_state_commit")
    with pytest.raises(Killed):
        run_catch_up(spark, job)
    monkeypatch.setattr(aggregate_apply, "maybe_crash", lambda phase, at: None)
    apply_epoch(upstream, random_ops(rng))
    run_catch_up(spark, job)  # first brings the MV up to the state, then applies the new epoch

    assert assert_every_commit_matches(upstream.uri, job.target, AGGREGATE, job.app_id, key=["g"]) == 3
    last = json.loads(mv_commits(job.target)[-1]["airflow_backfill.plan"])
    if plan == "recompute":
        assert last["plan"] == "recompute"
    else:
        assert last["plan"] == "incremental" and last["writes"] == {"state": plan, "mv": plan}


def test_auto_recomputes_when_the_jobs_incremental_rounds_ran_far_slower_than_estimated(spark, tables):
    """Its recomputes ran as estimated: the incremental ways are what is slow here, not the
    machine (a plan without rounds of its own is corrected like the job's other rounds)."""
    source = tables["source"]
    create_orders_table(source, rows=200, seed=12)
    job = orders_job(tables)
    run_snapshot(spark, job)
    slow = [{"plan": way, "estimate_s": 1.0, "seconds": 5.0, "epoch": 0}
            for way in ("append", "replace", "merge", "patch", "overwrite") for _ in range(3)]
    slow += [{"plan": "recompute", "estimate_s": 1.0, "seconds": 1.0, "epoch": 0}] * 3
    job_state.update_state(job.target, **{ROUND_COSTS: slow})
    commit_epoch(source, random.Random(12), inserts=5, updates=10, deletes=5)

    result = run_catch_up(spark, job)

    assert [r.plan for r in result.rounds] == ["recompute"]
    assert round_plans(job.target) == ["recompute"]
    assert assert_every_commit_matches(source, job.target, QUERY, job.app_id, key=["order_id"]) == 2
    kept = job_state.read_state(job.target)[ROUND_COSTS]
    assert kept[-1]["plan"] == "recompute" and kept[-1]["seconds"] > 0


@pytest.mark.parametrize("plan", ("recompute", "replace"))
def test_a_key_held_twice_is_refused_before_anything_is_committed(spark, tables, monkeypatch, plan):
    source = tables["source"]
    create_orders_table(source, rows=50, seed=13)
    job = plan_job(tables, plan, monkeypatch)
    run_snapshot(spark, job)
    append_orders(source, [7])  # order 7 exists: the upstream now holds it twice

    with pytest.raises(RepeatedKeyError, match="order_id=7"):
        run_catch_up(spark, job)
    assert len(mv_commits(job.target)) == 1


def test_updates_of_rows_the_where_leaves_out_keep_a_round_of_new_rows_a_replace(spark, tables, monkeypatch):
    """A key whose rows before and after the round both fail the WHERE is no change to the
    MV: updates of such rows beside updates of held rows still make a replace, not a
    MERGE of new rows and departures."""
    source = tables["source"]
    create_orders_table(source, rows=300, seed=21)
    job = plan_job(tables, "replace", monkeypatch)
    run_snapshot(spark, job)
    upstream = DeltaTable(source).to_pyarrow_table(columns=["order_id", "status"]).to_pylist()
    left_out = [row["order_id"] for row in upstream if row["status"] == "cancelled"][:5]
    held = [row["order_id"] for row in upstream if row["status"] != "cancelled"][:5]
    assert len(left_out) == len(held) == 5
    DeltaTable(source).update(updates={"amount": "amount + 1"},
                              predicate=f"order_id IN ({', '.join(map(str, left_out + held))})")

    run_catch_up(spark, job)

    assert round_plans(job.target) == ["replace"]
    assert assert_every_commit_matches(source, job.target, QUERY, job.app_id, key=["order_id"]) == 2


def test_a_recompute_proves_the_key_from_the_feed_when_the_range_inserted_no_row(spark, tables, monkeypatch):
    """Updates in place leave every key held once: the feed's key columns show it, and the
    upstream's keys are not counted. An UPDATE that moves a row onto a key another row
    holds is refused all the same, by counting them."""
    source = tables["source"]
    create_orders_table(source, rows=50, seed=13)
    job = orders_job(tables, round_plan="recompute")
    run_snapshot(spark, job)
    counted = spark_key_counts(monkeypatch)
    DeltaTable(source).update(updates={"amount": "amount + 1"}, predicate="order_id < 20")
    DeltaTable(source).delete("order_id = 30")

    run_catch_up(spark, job)

    assert counted == []
    assert round_plans(job.target) == ["recompute"]
    assert assert_every_commit_matches(source, job.target, QUERY, job.app_id, key=["order_id"]) == 2
    DeltaTable(source).update(updates={"order_id": "7"}, predicate="order_id = 8")
    with pytest.raises(RepeatedKeyError, match="order_id=7"):
        run_catch_up(spark, job)
    assert counted  # the key that gained a row made the round count the upstream's keys
    assert len(mv_commits(job.target)) == 2


def test_a_recompute_after_inserts_proves_the_key_from_the_files(spark, tables, monkeypatch):
    """New orders leave every key held once: the driver proves it from the files' key
    columns and Spark counts nothing. A copy of an existing order makes the driver's
    proof fail, and Spark's count refuses the upstream."""
    source = tables["source"]
    create_orders_table(source, rows=50, seed=13)
    job = orders_job(tables, round_plan="recompute")
    run_snapshot(spark, job)
    counted = spark_key_counts(monkeypatch)
    DeltaTable(source).update(updates={"amount": "amount + 1"}, predicate="order_id = 5")  # not appends only
    append_orders(source, [51, 52, 53])

    run_catch_up(spark, job)

    assert counted == []
    assert round_plans(job.target) == ["recompute"]
    assert assert_every_commit_matches(source, job.target, QUERY, job.app_id, key=["order_id"]) == 2
    append_orders(source, [7, 54])
    with pytest.raises(RepeatedKeyError, match="order_id=7"):
        run_catch_up(spark, job)
    assert counted  # the driver found no proof, and Spark's count found the repeat
    assert len(mv_commits(job.target)) == 2


def test_updates_over_the_whole_mv_recompute_before_their_feed_is_read(spark, tables, monkeypatch):
    """A range of updates must find its keys in the MV's files that the change files' key
    range meets (all of them here): when that costs more than a recompute, the round
    recomputes without reading its feed. A range that inserts rows may be an append, so
    it reads its feed before it chooses."""
    source = tables["source"]
    create_orders_table(source, rows=300, seed=31)
    job = orders_job(tables)
    run_snapshot(spark, job)
    monkeypatch.setattr(plan_choice, "rates_at",
                        lambda parallelism: Rates(per_scanned_row=0.1, per_patched_row=0.1))
    feeds: list = []
    read_feed = round_feed.feed_in_driver
    monkeypatch.setattr(round_feed, "feed_in_driver",
                        lambda *args, **kwargs: feeds.append(args) or read_feed(*args, **kwargs))
    DeltaTable(source).update(updates={"amount": "amount + 1"}, predicate="order_id % 7 = 0")

    run_catch_up(spark, job)

    assert feeds == [] and round_plans(job.target) == ["recompute"]
    commit_epoch(source, random.Random(31), inserts=5, updates=5, deletes=0)
    run_catch_up(spark, job)
    assert len(feeds) == 1
    assert assert_every_commit_matches(source, job.target, QUERY, job.app_id, key=["order_id"]) == 3
