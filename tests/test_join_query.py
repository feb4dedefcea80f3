"""The join planner and the job's `sources`: every refused shape names what to change,
and the MV key comes from the upstreams' keys (no Spark, no tables)."""

from __future__ import annotations

import pytest

from airflow_backfill.engine.joins.rounds import round_target
from airflow_backfill.engine.planning.join_query import plan_join
from airflow_backfill.exceptions import BackfillConfigError, UnsupportedQueryError
from airflow_backfill.job import BackfillJob

COLUMNS = {
    "customer": ["c_id", "c_nation", "c_segment", "c_name"],
    "orders": ["o_id", "o_cust", "o_status", "o_day"],
    "items": ["i_order", "i_line", "i_qty", "i_price"],
    "nation": ["n_id", "n_name"],
    "notes": ["o_id", "text"],  # shares a column name with orders
}
KEYS = {"customer": ["c_id"], "orders": ["o_id"], "items": ["i_order", "i_line"], "nation": ["n_id"],
        "notes": ["o_id"]}


def plan(query: str, names=("customer", "orders", "items")):
    return plan_join(query, [(name, KEYS[name]) for name in names], {name: COLUMNS[name] for name in names})


REFUSED = [
    ("SELECT o.o_id FROM orders o JOIN stock s ON s.x = o.o_id", "reads `stock`, which is not one of the job's sources"),
    ("SELECT o.o_id, i.i_line, i.i_order FROM orders o JOIN items i ON i.i_order = o.o_id",
     "does not read the source(s) customer"),
    ("SELECT o.o_id FROM orders o JOIN orders p ON p.o_id = o.o_id JOIN customer c ON c.c_id = o.o_cust "
     "JOIN items i ON i.i_order = o.o_id", "reads `orders` twice"),
    ("SELECT o.o_id FROM orders o RIGHT JOIN customer c ON c.c_id = o.o_cust JOIN items i ON i.i_order = o.o_id",
     "RIGHT JOIN c is not supported: swap the two tables and write LEFT JOIN"),
    ("SELECT o.o_id FROM orders o FULL OUTER JOIN customer c ON c.c_id = o.o_cust JOIN items i ON i.i_order = o.o_id",
     "FULL OUTER JOIN c is not supported"),
    ("SELECT o.o_id FROM orders o CROSS JOIN customer c JOIN items i ON i.i_order = o.o_id",
     "the join of c has no equality with an earlier table (a CROSS JOIN)"),
    ("SELECT o_id FROM orders, customer, items WHERE i_order = o_id", "the join of customer has no equality"),
    ("SELECT o.o_id FROM orders o JOIN customer c ON c.c_id < o.o_cust JOIN items i ON i.i_order = o.o_id",
     "the join condition c.c_id < o.o_cust of c is not an equality between a column of c and a column of an "
     "earlier table"),
    ("SELECT o.o_id FROM orders o JOIN customer c ON c.c_id = o.o_cust OR c.c_id = 0 JOIN items i "
     "ON i.i_order = o.o_id", "is not an equality between a column of c"),
    ("SELECT o.o_id FROM orders o JOIN customer c ON c.c_id = o.o_cust AND c.c_segment = 'auto' JOIN items i "
     "ON i.i_order = o.o_id", "Move filters of one table to WHERE"),
    ("SELECT o.o_id FROM orders o JOIN customer c ON c.c_id = o.o_cust JOIN items i ON i.i_order = o.o_id "
     "AND i.i_qty = c.c_nation", "links it to o and c: each joined table may be linked to one earlier table"),
    ("SELECT o.o_id FROM orders o JOIN customer c USING (c_id) JOIN items i ON i.i_order = o.o_id",
     "JOIN c USING (...) is not supported"),
    ("SELECT o.o_id FROM orders o NATURAL JOIN customer c JOIN items i ON i.i_order = o.o_id", "NATURAL JOIN c"),
    ("SELECT o.o_id FROM orders o LEFT SEMI JOIN customer c ON c.c_id = o.o_cust JOIN items i ON i.i_order = o.o_id",
     "LEFT SEMI JOIN c is not supported"),
    ("SELECT o.o_id FROM orders o LEFT ANTI JOIN customer c ON c.c_id = o.o_cust JOIN items i ON i.i_order = o.o_id",
     "LEFT ANTI JOIN c is not supported"),
    ("SELECT o.o_id, i.i_order, i.i_line FROM orders o LEFT JOIN items i ON i.i_order = o.o_id JOIN customer c "
     "ON c.c_id = i.i_qty", "c is INNER JOINed on the columns of i, which is LEFT JOINed"),
    ("SELECT o_id FROM orders o JOIN customer c ON c.c_id = o.o_cust JOIN items i ON i.i_order = o.o_id "
     "JOIN notes n ON n.o_id = o.o_id", "column o_id is ambiguous: upstreams orders and notes both have it"),
    ("SELECT o.o_id, colour FROM orders o JOIN customer c ON c.c_id = o.o_cust JOIN items i ON i.i_order = o.o_id",
     "column colour is in none of the upstreams"),
    ("SELECT x.o_id FROM orders o JOIN customer c ON c.c_id = o.o_cust JOIN items i ON i.i_order = o.o_id",
     "column x.o_id names the table `x`, which the query does not read"),
    ("SELECT o.o_mood FROM orders o JOIN customer c ON c.c_id = o.o_cust JOIN items i ON i.i_order = o.o_id",
     "column o.o_mood: o_mood is not a column of upstream orders"),
    ("SELECT * FROM orders o JOIN customer c ON c.c_id = o.o_cust JOIN items i ON i.i_order = o.o_id",
     "SELECT * (or t.*) is not supported over a join"),
    ("SELECT o.* FROM orders o JOIN customer c ON c.c_id = o.o_cust JOIN items i ON i.i_order = o.o_id",
     "SELECT * (or t.*) is not supported over a join"),
    ("SELECT o.o_id FROM orders o JOIN customer c ON c.c_id = o.o_cust JOIN items i ON i.i_order = o.o_id "
     "WHERE o.o_id IN (SELECT 1)", "subqueries are not supported"),
    ("SELECT o.o_id FROM (SELECT * FROM orders) o JOIN customer c ON c.c_id = o.o_cust JOIN items i "
     "ON i.i_order = o.o_id", "subqueries are not supported"),
    ("SELECT o.o_id, o.o_status FROM orders o JOIN customer c ON c.c_id = o.o_cust JOIN items i "
     "ON i.i_order = o.o_id", "the MV's key is the key of i (i_order, i_line): the query must select i.i_line"),
    ("SELECT o.o_id, i.i_line FROM orders o JOIN customer c ON c.c_id = o.o_cust LEFT JOIN items i "
     "ON i.i_order = o.o_id", "must select i.i_order"),
    ("SELECT o.o_status, MIN(i.i_qty) AS m FROM orders o JOIN customer c ON c.c_id = o.o_cust JOIN items i "
     "ON i.i_order = o.o_id GROUP BY o.o_status", "MIN, MAX and COUNT(DISTINCT) over a join are not supported"),
    ("SELECT o.o_status, SUM(i.i_qty) AS s FROM orders o JOIN customer c ON c.c_id = o.o_cust JOIN items i "
     "ON i.i_order = o.o_id GROUP BY o.o_status, c.c_name", "the GROUP BY key c.c_name must be selected"),
    ("SELECT DISTINCT i.i_order, i.i_line FROM orders o JOIN customer c ON c.c_id = o.o_cust JOIN items i "
     "ON i.i_order = o.o_id", "DISTINCT"),
    ("SELECT i.i_order, i.i_line, rank() OVER (ORDER BY o.o_day) AS r FROM orders o JOIN customer c "
     "ON c.c_id = o.o_cust JOIN items i ON i.i_order = o.o_id", "window functions"),
    ("SELECT i.i_order, i.i_line, rand() AS r FROM orders o JOIN customer c ON c.c_id = o.o_cust JOIN items i "
     "ON i.i_order = o.o_id", "non-deterministic function"),
]


@pytest.mark.parametrize(("query", "message"), REFUSED, ids=[message[:40] for _, message in REFUSED])
def test_refused_join_shapes_name_what_to_change(query, message):
    with pytest.raises(UnsupportedQueryError) as refused:
        plan(query, names=("orders", "customer", "items", "notes") if "notes" in query else
             ("orders", "customer", "items"))
    assert message in str(refused.value)


def test_a_key_column_missing_from_its_upstream_is_named():
    with pytest.raises(UnsupportedQueryError, match="primary_key o_key is not a column of upstream orders"):
        plan_join("SELECT o.o_id, c.c_id FROM orders o JOIN customer c ON c.c_id = o.o_cust",
                  [("orders", ["o_key"]), ("customer", ["c_id"])], COLUMNS)


def test_a_key_column_spelled_in_another_case_is_refused_with_its_spelling():
    with pytest.raises(UnsupportedQueryError, match=r"primary_key 'O_ID' of source orders: the upstream spells "
                                                    r"this column 'o_id'.*sources.orders.primary_key \(\[o_id\]\)"):
        plan_join("SELECT o.o_id, c.c_id FROM orders o JOIN customer c ON c.c_id = o.o_cust",
                  [("orders", ["O_ID"]), ("customer", ["c_id"])], COLUMNS)


def test_dimensions_joined_by_their_keys_leave_the_fact_key():
    planned = plan("SELECT i.i_order, i.i_line, c.c_name FROM items i JOIN orders o ON i.i_order = o.o_id "
                   "JOIN customer c ON o.o_cust = c.c_id")
    assert planned.key_tables == (0,) and planned.mv_key == ("i_order", "i_line")
    assert not planned.null_safe_key
    assert [(t.name, t.parent, t.kind) for t in planned.tables] == [
        ("items", None, None), ("orders", 0, "inner"), ("customer", 1, "inner")]
    assert planned.tables[1].columns == ("o_id", "o_cust")  # only what the round reads


def test_an_inner_join_equality_lets_an_equal_column_carry_the_key():
    planned = plan("SELECT o.o_id AS ok, i.i_line, c.c_name FROM customer c JOIN orders o ON o.o_cust = c.c_id "
                   "JOIN items i ON i.i_order = o.o_id")
    assert planned.key_tables == (2,) and planned.mv_key == ("ok", "i_line")


def test_a_padded_table_with_its_own_rows_keeps_its_key_in_the_mv_key():
    planned = plan("SELECT o.o_id, i.i_order, i.i_line, c.c_name FROM orders o LEFT JOIN items i "
                   "ON i.i_order = o.o_id LEFT JOIN customer c ON c.c_id = o.o_cust")
    assert planned.key_tables == (0, 1) and planned.mv_key == ("o_id", "i_order", "i_line")
    assert planned.null_safe_key and [t.padded for t in planned.tables] == [False, True, True]
    assert planned.core() == [0]


def test_comma_joins_take_their_equalities_from_where_and_keep_the_filters():
    planned = plan("SELECT o_id, o_day, SUM(i_qty * i_price) AS revenue FROM customer, orders, items "
                   "WHERE c_segment = 'building' AND c_id = o_cust AND i_order = o_id GROUP BY o_id, o_day")
    assert [(t.parent, t.on) for t in planned.tables] == [
        (None, ()), (0, (("c_id", "o_cust"),)), (1, (("o_id", "i_order"),))]
    assert planned.kind == "aggregate" and planned.mv_key == ("o_id", "o_day")
    assert "WHERE `customer__c_segment` = 'building' GROUP BY" in planned.flat.query


JOB = {"name": "joined", "target": "/lake/mv",
       "query": "SELECT o.o_id, c.c_name FROM orders o JOIN customer c ON o.o_cust = c.c_id",
       "sources": {"orders": {"table": "/lake/orders", "primary_key": ["o_id"]},
                   "customer": {"table": "/lake/customer", "primary_key": "c_id"}}}


@pytest.mark.parametrize(("change", "message"), [
    ({"sources": {"orders": JOB["sources"]["orders"]}}, "sources names 1 upstream; a join reads two to 4"),
    ({"sources": {f"t{i}": {"table": f"/lake/t{i}", "primary_key": ["k"]} for i in range(5)}},
     "a join MV reads at most 4"),
    ({"source": "/lake/orders"}, "takes no top-level `source`"),
    ({"primary_key": ["o_id"]}, "takes no top-level `primary_key`"),
    ({"sources": {**JOB["sources"], "2bad": {"table": "/lake/x", "primary_key": ["k"]}}}, "is not a SQL identifier"),
    ({"sources": {**JOB["sources"], "stock": {"table": "/lake/stock"}}},
     "sources.stock must have exactly `table` and `primary_key`"),
    ({"sources": {**JOB["sources"], "stock": "/lake/stock"}}, "sources.stock must have exactly"),
    ({"sources": {**JOB["sources"], "stock": {"table": "/lake/orders", "primary_key": ["k"]}}},
     "sources orders and stock are the same table"),
    ({"sources": {**JOB["sources"], "Orders": {"table": "/lake/o2", "primary_key": ["k"]}}},
     "sources names 'Orders' twice"),
    ({"sources": {**JOB["sources"], "stock": {"table": "/lake/mv", "primary_key": ["k"]}}},
     "upstream stock and target are the same table"),
    ({"sources": {**JOB["sources"], "stock": {"table": "/lake/stock", "primary_key": []}}},
     "sources.stock: primary_key must be a column name"),
    ({"sources": {**JOB["sources"], "stock": {"table": "gs://b/stock", "primary_key": ["k"]}}},
     "sources.stock: table='gs://b/stock'"),
    ({"sources": ["orders", "customer"]}, "sources must map each upstream's name to its table and key"),
    ({"sources": {}}, "sources names 0 upstream"),
    ({"round_plan": "rebuild"}, "round_plan must be one of"),
])
def test_invalid_sources_name_the_problem(change, message):
    with pytest.raises(BackfillConfigError) as refused:
        BackfillJob.from_mapping({**JOB, **change})
    assert message in str(refused.value)


def test_a_join_job_round_trips_and_lists_its_upstreams():
    job = BackfillJob.from_mapping(JOB)
    assert job.is_join and job.source == "" and job.primary_key == ()
    assert [(u.name, u.table, u.primary_key) for u in job.upstreams] == [
        ("orders", "/lake/orders", ("o_id",)), ("customer", "/lake/customer", ("c_id",))]
    assert BackfillJob.from_mapping(job.to_mapping()) == job
    assert job.with_overrides(backfill_parallelism=3).upstreams == job.upstreams
    assert job.with_overrides(round_plan="incremental").round_plan == "incremental"
    assert job.with_overrides(round_plan="recompute").round_plan == "recompute"  # as a dag_run.conf override
    single = BackfillJob.from_mapping({"name": "one", "source": "/lake/orders", "target": "/lake/mv",
                                       "query": "SELECT o_id FROM source", "primary_key": "o_id"})
    assert not single.is_join and [u.name for u in single.upstreams] == ["source"]
    assert "sources" not in single.to_mapping()


def test_bounded_rounds_take_the_upstreams_furthest_behind_first():
    job = BackfillJob.from_mapping({**JOB, "sources": {
        name: {"table": f"/lake/{name}", "primary_key": ["k"]} for name in ("customer", "orders", "items")},
        "query": "SELECT o.k, c.k AS c_k, i.k AS i_k FROM orders o JOIN customer c ON o.c = c.k "
                 "JOIN items i ON i.o = o.k"})
    watermark = {"customer": 0, "orders": 0, "items": 0}
    latest = {"customer": 2, "orders": 2, "items": 2}
    targets = []
    while watermark != latest:
        watermark = round_target(job, watermark, latest, max_epochs=2, max_bytes=None)
        targets.append(watermark)
    assert targets == [{"customer": 1, "orders": 1, "items": 0}, {"customer": 2, "orders": 1, "items": 1},
                       {"customer": 2, "orders": 2, "items": 2}]
    assert round_target(job, latest, latest, max_epochs=2, max_bytes=None) == latest
    assert round_target(job, {**latest, "items": 0}, latest, max_epochs=None, max_bytes=None) == latest
