"""Join MVs through snapshot, catch-up and forward, each MV commit checked against the
query recomputed independently (DuckDB) over every upstream as of its recorded version.

The upstreams are tiny (tests/join_upstreams.py) and every epoch mixes inserts,
updates of foreign keys and deletes, so inner-join matches and LEFT JOIN padding appear
and vanish; each scenario runs few rounds that move several upstreams at once."""

from __future__ import annotations

import dataclasses
import json
import random
from decimal import Decimal

import pytest
from helpers_delta import mv_commits
from join_reads import driver_lookups, refuse_lookups_of
from join_upstreams import create, create_all, random_epoch, sources

from airflow_backfill.engine.phases.catch_up import run_catch_up
from airflow_backfill.engine.phases.forward import ForwardBounds, run_forward
from airflow_backfill.engine.phases.snapshot import run_snapshot
from airflow_backfill.engine.verify import verify_mv
from airflow_backfill.job import BackfillJob
from oracle import assert_every_join_commit_matches, table_rows

pytestmark = pytest.mark.spark

QUERIES = {
    "inner_chain": (
        "SELECT i.i_order, i.i_line, i.i_qty * i.i_price AS amount, o.o_status, c.c_segment "
        "FROM items i JOIN orders o ON i.i_order = o.o_id JOIN customer c ON o.o_cust = c.c_id "
        "WHERE o.o_status IS NOT NULL",
        ("customer", "orders", "items"), ["i_order", "i_line"],
    ),
    "left_chain_of_four": (  # the padded side's key is part of the MV key; nation hangs off customer
        "SELECT o.o_id, i.i_order, i.i_line, i.i_qty, c.c_segment, n.n_name FROM orders o "
        "LEFT JOIN items i ON i.i_order = o.o_id LEFT JOIN customer c ON c.c_id = o.o_cust "
        "LEFT JOIN nation n ON n.n_id = c.c_nation WHERE o.o_status IS DISTINCT FROM 'p'",
        ("nation", "customer", "orders", "items"), ["o_id", "i_order", "i_line"],
    ),
    "aggregate_over_inner": (  # TPC-H Q3's shape, with comma joins as Q3 writes them
        "SELECT o_id, o_day, SUM(i_qty * i_price) AS revenue, COUNT(*) AS n FROM customer, orders, items "
        "WHERE c_segment = 'building' AND c_id = o_cust AND i_order = o_id AND i_qty > 1 GROUP BY o_id, o_day",
        ("customer", "orders", "items"), ["o_id", "o_day"],
    ),
    "aggregate_over_left": (
        "SELECT o.o_status, COUNT(i.i_line) AS lines, COUNT(*) AS n, AVG(i.i_qty) AS mean_qty "
        "FROM orders o LEFT JOIN items i ON i.i_order = o.o_id GROUP BY o.o_status HAVING COUNT(*) > 1",
        ("orders", "items"), ["o_status"],
    ),
}


def join_job(tables, target: str, query: str, **overrides) -> BackfillJob:
    """A job over the tiny test tables. Its rounds apply their changes (`incremental`): under
    `auto` a join this small is recomputed every round (tests/test_join_recompute.py)."""
    fields = dict(name="joined", target=target, query=query, sources=sources(tables), lag_threshold=0,
                  poll_interval=0.05, backfill_parallelism=2, parallelism=1, round_plan="incremental")
    return BackfillJob(**{**fields, **overrides})


def uris(tables) -> dict[str, str]:
    return {name: table.uri for name, table in tables.items()}


def prefer_ways(monkeypatch, ways: tuple[str, ...]) -> None:
    """Make every keyed write of a join round take the first of `ways` its estimates offer
    (they offer only the ways that can apply the round's changes), whatever they cost:
    the tiny test tables would otherwise always be overwritten."""
    from airflow_backfill.engine.aggregates import apply as aggregate_apply
    from airflow_backfill.engine.joins import apply as join_apply

    def first_offered(estimates):
        return next((way for way in ways if way in estimates), min(estimates, key=estimates.get))

    planned = join_apply.plan_round
    monkeypatch.setattr(join_apply, "plan_round",
                        lambda job, estimates, facts: dataclasses.replace(planned(job, estimates, facts),
                                                                          plan=first_offered(estimates)))
    monkeypatch.setattr(aggregate_apply, "_cheapest", first_offered)


# Rounds of the tiny test tables take the cheapest way, an overwrite of the whole MV, whatever
# the shape; the LEFT chain covers it here, the inner shapes in tests/test_join_leave_arrive.py
# (the others run in MERGE and in the narrowest ways below). The driver reads the feeds and
# looks the other tables' rows up; `mixed` leaves one table to Spark, so walks switch from
# the driver's rows to Spark's midway. Joins read wholly through Spark run in the
# differential harness's full matrix (`python tests/differential_run.py W --sizes spark`)
# and in tests/test_join_leave_arrive.py.
@pytest.mark.parametrize("reads", ["driver", "mixed"])
@pytest.mark.parametrize("shape", ["left_chain_of_four"])
def test_join_mv_matches_at_every_commit(spark, tmp_path, monkeypatch, shape, reads):
    refused = QUERIES[shape][1][2]
    if reads == "mixed":
        refuse_lookups_of(monkeypatch, refused)
    looked_up = driver_lookups(monkeypatch)
    plans = run_scenario(spark, tmp_path, shape)
    assert any("overwrite" in json.dumps(plan) for plan in plans), plans
    assert looked_up, looked_up
    assert (refused in looked_up) == (reads == "driver"), looked_up


MERGE_ONLY, NARROWEST = ("merge",), ("append", "delete", "replace", "merge")
# The stateless shapes under MERGE alone add nothing the narrowest ways do not (they fall
# back to MERGE for a mixed round) but minutes of CI; a grouped inner join under MERGE runs
# in the differential harness (its `joined_grouped` MV takes every way in turn).
WAY_CASES = [pytest.param(shape, ways, id=f"{shape}-{name}")
             for shape in sorted(QUERIES) for name, ways in (("merge", MERGE_ONLY), ("narrowest", NARROWEST))
             if (shape, name) not in {("left_chain_of_four", "merge"), ("inner_chain", "merge"), ("aggregate_over_inner", "merge")}]


@pytest.mark.parametrize(("shape", "ways"), WAY_CASES)
def test_join_rounds_match_in_every_way_they_can_write(spark, tmp_path, monkeypatch, shape, ways):
    prefer_ways(monkeypatch, ways)
    plans = run_scenario(spark, tmp_path, shape)
    written = {way for plan in plans for way in [plan.get("plan"), *plan.get("writes", {}).values()]}
    assert written & set(ways), plans


def run_scenario(spark, tmp_path, shape: str, **overrides) -> list[dict]:
    """Snapshot, a catch-up round moving every upstream, a forward round moving some; every
    commit checked. Returns the plans the two rounds recorded."""
    query, names, key = QUERIES[shape]
    tables = create_all(str(tmp_path), seed=len(shape), names=names)
    job = join_job(tables, str(tmp_path / "mv"), query, **overrides)
    rng = random.Random(shape)
    run_snapshot(spark, job)
    for table in tables.values():  # a backlog on every upstream: one catch-up round
        random_epoch(table, rng)
    moved = [table for table in tables.values() if rng.random() < 0.7] or list(tables.values())[:1]
    for table in moved:  # and a second epoch on some of them
        random_epoch(table, rng, changes=4)
    run_catch_up(spark, job)
    for table in list(tables.values())[::2]:  # forward picks up what arrived since
        random_epoch(table, rng)
    run_forward(spark, job, bounds=ForwardBounds(max_epochs=1, idle_timeout=5))

    vectors = assert_every_join_commit_matches(uris(tables), job.target, query, job.app_id, key=key)
    assert vectors[-1] == {name: table.version() for name, table in tables.items()}
    commits = mv_commits(job.target)
    assert [c["airflow_backfill.phase"] for c in commits] == ["snapshot", "catch_up", "forward"]
    return [json.loads(c.get("airflow_backfill.plan", "{}")) for c in commits[1:]]


def test_left_join_padding_is_retracted_and_restored(spark, tmp_path):
    query = ("SELECT o.o_id, o.o_status, i.i_order, i.i_line, i.i_qty FROM orders o "
             "LEFT JOIN items i ON i.i_order = o.o_id")
    orders = create(str(tmp_path), "orders", [{"o_id": 1, "o_cust": 1, "o_status": "o", "o_day": 1},
                                              {"o_id": 2, "o_cust": 1, "o_status": "f", "o_day": 2}])
    items = create(str(tmp_path), "items", [{"i_order": 2, "i_line": 0, "i_qty": 5, "i_price": Decimal("1.00")}])
    tables = {"orders": orders, "items": items}
    job = join_job(tables, str(tmp_path / "mv"), query)
    run_snapshot(spark, job)  # order 1 padded, order 2 matched
    steps = [
        (items, [{"i_order": 1, "i_line": 0, "i_qty": 3, "i_price": None}], []),  # 1's padding retracted
        (items, [], [(2, 0)]),  # 2's only item leaves: 2 padded again
        (items, [{"i_order": 2, "i_line": 0, "i_qty": 3, "i_price": None},  # 1's item moves to 2 ...
                 {"i_order": 3, "i_line": 1, "i_qty": 1, "i_price": None}], [(1, 0)]),  # ... one for no order
        (orders, [{"o_id": 3, "o_cust": 2, "o_status": None, "o_day": 3}], [(1,)]),  # its order arrives
    ]
    for table, upserts, deletes in steps:
        table.commit(upserts, deletes)
        run_forward(spark, job, bounds=ForwardBounds(max_epochs=1, idle_timeout=5))
    vectors = assert_every_join_commit_matches(uris(tables), job.target, query, job.app_id,
                                               key=["o_id", "i_order", "i_line"])
    assert len(vectors) == 1 + len(steps)
    final = sorted(table_rows(job.target).to_pylist(), key=lambda row: row["o_id"])
    assert [(row["o_id"], row["i_line"]) for row in final] == [(2, 0), (3, 1)]
    report = verify_mv(spark, job)  # Spark's own recompute over each upstream at its recorded version
    assert report.equal and report.watermark == sum(vectors[-1].values()), report.lines()


def test_a_join_whose_core_upstream_is_empty_is_created_empty(spark, tmp_path):
    """No chunk writes a row, while the MV's folder already holds the job's state: the
    snapshot still creates the MV, empty, with the vector as its watermark."""
    query = "SELECT o.o_id, i.i_order, i.i_line FROM orders o LEFT JOIN items i ON i.i_order = o.o_id"
    tables = {"orders": create(str(tmp_path), "orders", []),
              "items": create(str(tmp_path), "items", [{"i_order": 1, "i_line": 0, "i_qty": 1, "i_price": None}])}
    job = join_job(tables, str(tmp_path / "mv"), query)
    run_snapshot(spark, job)
    assert table_rows(job.target).num_rows == 0
    assert [c["airflow_backfill.phase"] for c in mv_commits(job.target)] == ["snapshot"]
    report = verify_mv(spark, job)
    assert report.equal and report.watermark == sum(t.version() for t in tables.values()), report.lines()
