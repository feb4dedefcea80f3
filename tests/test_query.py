from __future__ import annotations

import pytest

from airflow_backfill.engine.planning.query import plan_query
from airflow_backfill.exceptions import UnsupportedQueryError


def test_stateless_query_maps_the_upstream_key_to_its_output_name():
    plan = plan_query(
        "SELECT order_id AS id, amount * quantity AS total FROM source WHERE status <> 'cancelled'",
        ("order_id",),
    )
    assert plan.kind == "stateless"
    assert plan.aggregate is None
    assert plan.upstream_key == ("order_id",)
    assert plan.mv_key == ("id",)
    assert plan.filters_rows  # the MV may lack upstream rows: rounds look keys up upstream


def test_star_carries_every_key_column():
    plan = plan_query("SELECT * FROM source", ("region", "order_id"))
    assert plan.mv_key == ("region", "order_id")
    assert not plan.filters_rows


def test_aggregate_is_keyed_by_its_group_by_outputs():
    plan = plan_query(
        "SELECT upper(status) AS s, customer_id, COUNT(*) AS n, SUM(amount) AS total "
        "FROM source WHERE quantity > 1 GROUP BY customer_id, upper(status)",
        ("order_id",),
    )
    assert plan.kind == "aggregate"
    assert plan.mv_key == ("customer_id", "s")
    aggregate = plan.aggregate
    assert aggregate is not None
    assert aggregate.group_by == ("customer_id", "UPPER(status)")
    assert aggregate.where == "quantity > 1"
    assert [call.function for call in aggregate.calls] == ["count_star", "sum"]


@pytest.mark.parametrize(
    ("group_by", "key"),
    [("GROUP BY 1, 2", ("s", "c")), ("GROUP BY s, c", ("s", "c")), ("GROUP BY upper(status), customer_id", ("s", "c"))],
)
def test_group_by_ordinals_and_aliases_resolve_to_the_same_keys(group_by: str, key: tuple[str, ...]):
    plan = plan_query(f"SELECT upper(status) AS s, customer_id AS c, COUNT(*) AS n FROM source {group_by}",
                      ("order_id",))
    assert plan.mv_key == key
    assert plan.aggregate is not None and plan.aggregate.group_by[0].lower() == "upper(status)"


def test_identical_aggregates_and_arguments_share_state():
    plan = plan_query(
        "SELECT g, SUM(x) AS s, AVG(x) AS a, SUM(x) + 1 AS s1, COUNT(DISTINCT x) AS d, MIN(x * 2) AS m "
        "FROM source GROUP BY g HAVING SUM(x) > 0",
        ("id",),
    )
    aggregate = plan.aggregate
    assert aggregate is not None
    assert aggregate.arguments == ("x", "x * 2")
    assert [(c.function, c.argument) for c in aggregate.calls] == [
        ("sum", 0), ("avg", 0), ("count_distinct", 0), ("min", 1)
    ]
    assert aggregate.projections == ("__g0", "__v0", "__v1", "__v0 + 1", "__v2", "__v3")
    assert aggregate.having == "__v0 > 0"
    assert aggregate.needs_recompute


def test_having_may_name_select_aliases_and_group_keys():
    plan = plan_query("SELECT g AS k, COUNT(*) AS n FROM source GROUP BY g HAVING n > 2 AND k <> 'x'", ("id",))
    assert plan.aggregate is not None
    assert plan.aggregate.having == "__v0 > 2 AND __g0 <> 'x'"


def test_only_algebraic_aggregates_need_no_recompute():
    plan = plan_query("SELECT g, COUNT(*) AS n, COUNT(x) AS c, SUM(x) AS s, AVG(x) AS a FROM source GROUP BY g",
                      ("id",))
    assert plan.aggregate is not None and not plan.aggregate.needs_recompute


@pytest.mark.parametrize(
    ("query", "construct"),
    [
        ("SELECT order_id FROM source JOIN other ON source.a = other.a", "JOIN"),
        ("SELECT SUM(amount) AS s, order_id FROM source", "aggregate function SUM(amount) without GROUP BY"),
        ("SELECT COUNT(*) AS n FROM source", "global aggregate"),
        ("SELECT DISTINCT order_id FROM source", "DISTINCT"),
        ("SELECT order_id FROM source LIMIT 10", "LIMIT"),
        ("SELECT order_id FROM source ORDER BY order_id", "ORDER BY"),
        ("SELECT order_id, RANK() OVER (ORDER BY amount) AS r FROM source", "window functions"),
        ("SELECT g, SUM(x) OVER () AS r FROM source GROUP BY g", "window functions"),
        ("SELECT order_id, rand() AS r FROM source", "non-deterministic function RAND()"),
        ("SELECT g, SUM(rand()) AS r FROM source GROUP BY g", "non-deterministic function RAND()"),
        ("SELECT order_id, current_timestamp() AS t FROM source", "non-deterministic function"),
        ("SELECT order_id, monotonically_increasing_id() AS i FROM source", "non-deterministic"),
        ("SELECT order_id FROM source WHERE order_id IN (SELECT 1)", "subqueries"),
        ("SELECT order_id FROM source UNION SELECT order_id FROM source", "UNION"),
        ("WITH s AS (SELECT * FROM source) SELECT order_id FROM s", "WITH"),
        ("SELECT order_id FROM orders", "FROM source"),
        ("SELECT amount FROM source", "primary-key column(s) order_id"),
        ("SELECT order_id + 1 AS order_id FROM source", "primary-key column(s) order_id"),
        ("SELECT order_id, amount AS x, status AS x FROM source", "more than once"),
        ("SELECT FROM WHERE", "not valid Spark SQL"),
        ("SELECT g, SUM(COUNT(*)) AS s FROM source GROUP BY g", "nested aggregate SUM(COUNT(*))"),
        ("SELECT g, STDDEV(x) AS s FROM source GROUP BY g", "aggregate function STDDEV(x) is not supported"),
        ("SELECT g, collect_list(x) AS s FROM source GROUP BY g", "is not supported"),
        ("SELECT g, try_sum(x) AS s FROM source GROUP BY g", "aggregate function TRY_SUM(x)"),
        ("SELECT g, SUM(DISTINCT x) AS s FROM source GROUP BY g", "SUM(DISTINCT ...)"),
        ("SELECT g, COUNT(DISTINCT x, y) AS s FROM source GROUP BY g", "COUNT(DISTINCT ...) of several"),
        ("SELECT g, COUNT(*) FILTER (WHERE x > 1) AS s FROM source GROUP BY g", "FILTER"),
        ("SELECT g, COUNT(*) AS n FROM source GROUP BY ROLLUP(g)", "ROLLUP"),
        ("SELECT g, COUNT(*) AS n FROM source GROUP BY CUBE(g)", "CUBE"),
        ("SELECT g, COUNT(*) AS n FROM source GROUP BY g WITH ROLLUP", "ROLLUP"),
        ("SELECT COUNT(*) AS n FROM source GROUP BY g", "GROUP BY key g must be selected"),
        ("SELECT upper(g), COUNT(*) AS n FROM source GROUP BY upper(g)", "an alias"),
        ("SELECT g, x, COUNT(*) AS n FROM source GROUP BY g", "column x in SELECT is neither a GROUP BY key"),
        ("SELECT g, COUNT(*) AS n FROM source GROUP BY g HAVING x > 1", "column x in HAVING"),
        ("SELECT g, COUNT(*) AS n FROM source WHERE SUM(x) > 1 GROUP BY g", "in WHERE is not allowed"),
        ("SELECT order_id FROM source WHERE SUM(x) > 1", "in WHERE is not allowed"),
        ("SELECT g, COUNT(*) AS n FROM source GROUP BY 3", "GROUP BY 3 refers to no SELECT column"),
        ("SELECT *, COUNT(*) AS n FROM source GROUP BY g", "SELECT *"),
        ("SELECT g, COUNT(*) AS n, SUM(x) AS N FROM source GROUP BY g", "more than once"),
    ],
)
def test_unsupported_queries_are_refused_by_name(query: str, construct: str):
    with pytest.raises(UnsupportedQueryError) as caught:
        plan_query(query, ("order_id",))
    assert construct in str(caught.value)


@pytest.mark.parametrize(("query", "expected"), [
    ("SELECT order_id, amount * quantity AS total FROM source WHERE status <> 'x'",
     {"order_id", "amount", "quantity", "status"}),
    ("SELECT source.order_id, upper(Status) AS s FROM source", {"source", "order_id", "status"}),
    ("SELECT * FROM source WHERE amount > 1", None),
])
def test_referenced_columns_are_what_a_round_reads_from_the_feed(query, expected):
    from airflow_backfill.engine.planning.query import referenced_columns

    assert referenced_columns(query) == (None if expected is None else frozenset(expected))
