from __future__ import annotations

import pytest

from airflow_backfill.engine.query import plan_query
from airflow_backfill.exceptions import UnsupportedQueryError


def test_stateless_query_maps_the_upstream_key_to_its_output_name():
    plan = plan_query(
        "SELECT order_id AS id, amount * quantity AS total FROM source WHERE status <> 'cancelled'",
        ("order_id",),
    )
    assert plan.kind == "stateless"
    assert plan.upstream_key == ("order_id",)
    assert plan.mv_key == ("id",)


def test_star_carries_every_key_column():
    plan = plan_query("SELECT * FROM source", ("region", "order_id"))
    assert plan.mv_key == ("region", "order_id")


@pytest.mark.parametrize(
    ("query", "construct"),
    [
        ("SELECT order_id FROM source JOIN other ON source.a = other.a", "JOIN"),
        ("SELECT order_id, COUNT(*) FROM source GROUP BY order_id", "GROUP BY"),
        ("SELECT SUM(amount) AS s, order_id FROM source", "aggregate function SUM"),
        ("SELECT DISTINCT order_id FROM source", "DISTINCT"),
        ("SELECT order_id FROM source LIMIT 10", "LIMIT"),
        ("SELECT order_id FROM source ORDER BY order_id", "ORDER BY"),
        ("SELECT order_id, RANK() OVER (ORDER BY amount) AS r FROM source", "window functions"),
        ("SELECT order_id, rand() AS r FROM source", "non-deterministic function RAND()"),
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
    ],
)
def test_unsupported_queries_are_refused_by_name(query: str, construct: str):
    with pytest.raises(UnsupportedQueryError, match=None) as caught:
        plan_query(query, ("order_id",))
    assert construct in str(caught.value)
