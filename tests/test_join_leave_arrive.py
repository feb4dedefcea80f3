"""Rounds of an INNER join MV: the join rows that leave are read from the MV where it
selects the changed table's key (from an aggregate's state where its grouping holds it),
the rest are walked (engine/joins/leave_arrive.py).

Every MV commit is compared with the query recomputed independently (DuckDB) over each
upstream as of its recorded version; the upstreams are tiny and each epoch mixes inserts,
updates of foreign keys and deletes, so rows leave through every table."""

from __future__ import annotations

import random

import pytest
from helpers_delta import mv_commits
from join_reads import driver_lookups, spark_reads_only
from join_upstreams import create_all, random_epoch, sources
from size_overrides import set_sizes

from airflow_backfill.engine.aggregates import apply as aggregates_apply
from airflow_backfill.engine.joins import apply as join_apply
from airflow_backfill.engine.joins import delta_rule, leave_arrive
from airflow_backfill.engine.phases.catch_up import run_catch_up
from airflow_backfill.engine.phases.snapshot import run_snapshot
from airflow_backfill.job import BackfillJob
from oracle import assert_every_join_commit_matches

pytestmark = pytest.mark.spark

# items' key and orders' (through i_order = o_id) are selected; customer's is not, so
# customer's lost rows are walked while the others' are read from the MV.
QUERY = (
    "SELECT i.i_order, i.i_line, i.i_qty * i.i_price AS amount, o.o_status, c.c_segment "
    "FROM items i JOIN orders o ON i.i_order = o.o_id JOIN customer c ON o.o_cust = c.c_id "
    "WHERE c.c_segment IS DISTINCT FROM 'auto'"
)
# Grouped by the order: a group holds the rows of one order, so it leaves whole when its
# order does (its state subtracted); lost items and customers are walked.
AGGREGATE_QUERY = (
    "SELECT o.o_id, o.o_day, SUM(i.i_qty * i.i_price) AS revenue, COUNT(*) AS n, AVG(i.i_qty) AS mean_qty "
    "FROM customer c, orders o, items i WHERE c.c_id = o.o_cust AND i.i_order = o.o_id "
    "AND c.c_segment IS DISTINCT FROM 'auto' GROUP BY o.o_id, o.o_day"
)
CASES = {"stateless": (QUERY, ["i_order", "i_line"], "_leaving_mv_rows", {"orders", "items"}),
         "aggregate": (AGGREGATE_QUERY, ["o_id", "o_day"], "_leaving_groups", {"orders"})}


@pytest.mark.parametrize(("shape", "reads"), [("stateless", "driver"), ("stateless", "spark"), ("aggregate", "driver"),
                                            ("aggregate", "spark")])
def test_rounds_read_leaving_rows_from_the_mv_and_match_at_every_commit(spark, tmp_path, monkeypatch, shape, reads):
    if reads == "spark":
        spark_reads_only(monkeypatch)
    looked_up = driver_lookups(monkeypatch)
    query, key, reader_name, held = CASES[shape]
    tables = create_all(str(tmp_path), seed=7, sizes={"customer": 10, "orders": 11, "items": 20})
    job = BackfillJob(name="inner", target=str(tmp_path / "mv"), query=query, sources=sources(tables),
                      lag_threshold=0, poll_interval=0.05, backfill_parallelism=2, parallelism=1,
                      round_plan="incremental")  # tables this small are recomputed under auto
    from_mv: list[set[str]] = []
    read_leaving = getattr(leave_arrive, reader_name)

    def recorded(spark, job, plan, lost, keys):
        from_mv.append({plan.tables[i].name for i in lost})
        return read_leaving(spark, job, plan, lost, keys)

    monkeypatch.setattr(leave_arrive, reader_name, recorded)
    folded, keyed, held_leaving, found_leaving = (
        _recorded(monkeypatch, aggregates_apply, "touched_in_driver"),
        _recorded(monkeypatch, join_apply, "keyed_and_old_in_driver"),
        _recorded(monkeypatch, leave_arrive, "_holding_held"), _recorded(monkeypatch, leave_arrive, "_holding_found"))
    assert not leave_arrive.pays_off(job)  # tables this small keep the telescoped rule ...
    set_sizes(monkeypatch, small_join_rows=0)  # ... unless told otherwise
    monkeypatch.setattr(delta_rule, "join_changes", lambda *a, **k: pytest.fail("the telescoped rule ran"))
    run_snapshot(spark, job)
    rng = random.Random(11)
    for _ in range(2):  # rounds that move most upstreams, over two epochs each
        for table in tables.values():
            if rng.random() < 0.8:
                random_epoch(table, rng, changes=5)
                random_epoch(table, rng, changes=3)
        run_catch_up(spark, job)

    vectors = assert_every_join_commit_matches({n: t.uri for n, t in tables.items()}, job.target, query,
                                               job.app_id, key=key)
    assert vectors[-1] == {name: table.version() for name, table in tables.items()}
    assert len(vectors) == 3, vectors  # the snapshot and two rounds
    assert from_mv and set().union(*from_mv) == held, from_mv
    # the tiny MV is written the cheapest way, a patch or an overwrite (tests/test_joins.py covers the others)
    plans = [commit["airflow_backfill.plan"] for commit in mv_commits(job.target) if "airflow_backfill.plan" in commit]
    assert any("overwrite" in plan or "patch" in plan for plan in plans), plans
    assert bool(looked_up) == (reads == "driver"), looked_up
    # the leaving rows or groups, the aggregate's fold and the stateless MV's keyed changes are
    # worked out by the driver when it holds the changes
    by_driver = reads == "driver"
    assert any(held_leaving + found_leaving) == by_driver, (held_leaving, found_leaving)
    assert (any(folded), any(keyed)) == (by_driver and shape == "aggregate", by_driver and shape == "stateless")


def _recorded(monkeypatch, module, name) -> list[bool]:
    """Whether each call of `module.name` gave a result (appended to as calls are made)."""
    results: list[bool] = []
    function = getattr(module, name)

    def recorded(*args, **kwargs):
        result = function(*args, **kwargs)
        results.append(result is not None)
        return result

    monkeypatch.setattr(module, name, recorded)
    return results


def test_only_joins_without_left_joins_take_the_leave_and_arrive_rule():
    from airflow_backfill.engine.planning.join_query import grouped_key, plan_join, selected_key

    columns = {"customer": ["c_id", "c_segment"], "orders": ["o_id", "o_cust", "o_status"],
               "items": ["i_order", "i_line", "i_qty"]}
    keys = [("customer", ["c_id"]), ("orders", ["o_id"]), ("items", ["i_order", "i_line"])]

    def plan(query: str, names: tuple[str, ...] = ("orders", "items")):
        return plan_join(query, [k for k in keys if k[0] in names], {n: columns[n] for n in names})

    inner = plan("SELECT i.i_order AS o, i.i_line, c.c_segment FROM items i JOIN orders o ON i.i_order = o.o_id "
                 "JOIN customer c ON o.o_cust = c.c_id", ("customer", "orders", "items"))
    assert leave_arrive.applies(inner)
    # orders' key through the equality i_order = o_id, renamed; customer's is not selected
    assert [selected_key(inner, i) for i in range(3)] == [("o", "i_line"), ("o",), None]
    assert not leave_arrive.applies(plan(
        "SELECT o.o_id, i.i_order, i.i_line FROM orders o LEFT JOIN items i ON i.i_order = o.o_id"))
    grouped = plan("SELECT i.i_order, COUNT(*) AS n FROM orders o JOIN items i ON i.i_order = o.o_id GROUP BY i.i_order")
    assert leave_arrive.applies(grouped)
    assert [grouped_key(grouped, i) for i in range(2)] == [(0,), None]  # orders' key, through i_order = o_id
    assert grouped.tables[1].columns == ("i_order", "i_line")  # the key is read, though the query does not
