"""The fifty MVs of the users' workload, over the four upstreams of `user_tables`.

20 stateless MVs with WHERE (projections with deterministic expressions over each type),
15 aggregates (COUNT, SUM, AVG, MIN, MAX, COUNT(DISTINCT), with WHERE and HAVING, grouped
by few and by many keys), 8 MVs over other MVs (chains of two and three: stateless ->
aggregate, stateless -> stateless -> aggregate, aggregate -> stateless) and 7 joins
(INNER and LEFT; line items with orders, orders with customers by the string key,
payments with orders; two of them grouped). Each is a job file's fields (docs/jobs.md).
"""

from __future__ import annotations

from typing import Any

from bench.user_tables import TABLES

STATELESS: dict[str, tuple[str, str]] = {
    "plain_orders_open": ("orders", "SELECT order_id, customer_code, status, amount, priority FROM source "
                                    "WHERE status <> 'cancelled'"),
    "plain_orders_net": ("orders", "SELECT order_id, amount * (1 - COALESCE(discount, 0)) AS net_amount, "
                                   "CAST(amount AS DOUBLE) * 1.2 AS gross FROM source WHERE amount > 100"),
    "plain_orders_gifts": ("orders", "SELECT order_id, customer_code, UPPER(status) AS status_code, ordered_at, "
                                     "COALESCE(note, 'none') AS note FROM source WHERE is_gift AND priority <= 3"),
    "plain_orders_day": ("orders", "SELECT order_id, CAST(ordered_at AS DATE) AS order_day, HOUR(ordered_at) AS "
                                   "order_hour, priority * 10 AS weight FROM source WHERE note IS NULL"),
    "plain_orders_band": ("orders", "SELECT order_id, CASE WHEN priority >= 4 THEN 'high' WHEN priority >= 2 THEN "
                                    "'mid' ELSE 'low' END AS band, NOT is_gift AS standard, "
                                    "LENGTH(customer_code) AS code_length FROM source "
                                    "WHERE discount IS NOT NULL AND discount < 0.2"),
    "plain_customers_active": ("customers", "SELECT customer_code, region, segment, credit_limit, tier FROM source "
                                            "WHERE active"),
    "plain_customers_emea": ("customers", "SELECT customer_code, LOWER(name) AS name_lower, score FROM source "
                                          "WHERE region IN ('emea-north', 'emea-south')"),
    "plain_customers_contact": ("customers", "SELECT customer_code, COALESCE(email, CONCAT(customer_code, "
                                             "'@unknown')) AS contact, signed_up_at FROM source WHERE tier >= 2"),
    "plain_customers_credit": ("customers", "SELECT customer_code, credit_limit * 2 AS doubled_limit, "
                                            "score * 100 AS score_pct FROM source WHERE credit_limit > 5000"),
    "plain_customers_signup": ("customers", "SELECT customer_code, YEAR(signed_up_at) AS signup_year, segment "
                                            "FROM source WHERE score > 0.5"),
    "plain_lines_open": ("line_items", "SELECT order_id, line_no, sku, quantity, unit_price FROM source "
                                       "WHERE NOT returned"),
    "plain_lines_value": ("line_items", "SELECT order_id, line_no, quantity * unit_price AS line_value, discount "
                                        "FROM source WHERE quantity > 1"),
    "plain_lines_shipped": ("line_items", "SELECT order_id, line_no, shipped_at, sku FROM source "
                                          "WHERE shipped_at IS NOT NULL"),
    "plain_lines_discounted": ("line_items", "SELECT order_id, line_no, unit_price * (1 - discount) AS net_price "
                                             "FROM source WHERE discount > 0.05"),
    "plain_lines_family": ("line_items", "SELECT order_id, line_no, SUBSTRING(sku, 1, 5) AS sku_family, quantity "
                                         "FROM source WHERE sku LIKE 'SKU-1%'"),
    "plain_payments_settled": ("payments", "SELECT payment_id, order_id, customer_code, method, amount FROM source "
                                           "WHERE settled"),
    "plain_payments_fees": ("payments", "SELECT payment_id, amount, fee, CAST(amount AS DOUBLE) - fee AS net "
                                        "FROM source WHERE fee > 0.5"),
    "plain_payments_retried": ("payments", "SELECT payment_id, attempts, method, paid_at FROM source "
                                           "WHERE attempts > 1"),
    "plain_payments_refs": ("payments", "SELECT payment_id, COALESCE(reference, 'n/a') AS reference, settled "
                                        "FROM source WHERE method <> 'voucher'"),
    "plain_payments_large": ("payments", "SELECT payment_id, order_id, customer_code, amount FROM source "
                                         "WHERE amount >= 500"),
}
"""Name -> (upstream, query): one MV row per upstream row the WHERE keeps."""

AGGREGATES: dict[str, tuple[str, str]] = {
    "agg_orders_by_status": ("orders", "SELECT status, COUNT(*) AS orders, SUM(amount) AS revenue, AVG(amount) AS "
                                       "average, SUM(CASE WHEN is_gift THEN 1 ELSE 0 END) AS gifts FROM source "
                                       "GROUP BY status"),
    "agg_orders_by_customer": ("orders", "SELECT customer_code, COUNT(*) AS orders, SUM(amount) AS total, "
                                         "MAX(ordered_at) AS last_order FROM source WHERE status <> 'cancelled' "
                                         "GROUP BY customer_code"),
    "agg_orders_by_priority": ("orders", "SELECT priority, MIN(amount) AS smallest, MAX(amount) AS largest, "
                                         "COUNT(DISTINCT customer_code) AS customers FROM source GROUP BY priority"),
    "agg_orders_by_day": ("orders", "SELECT CAST(ordered_at AS DATE) AS order_day, COUNT(*) AS orders, "
                                    "SUM(discount) AS discounts FROM source GROUP BY CAST(ordered_at AS DATE)"),
    "agg_orders_gift_buyers": ("orders", "SELECT customer_code, COUNT(*) AS gifts FROM source WHERE is_gift "
                                         "GROUP BY customer_code HAVING COUNT(*) > 1"),
    "agg_customers_by_region": ("customers", "SELECT region, COUNT(*) AS customers, AVG(score) AS average_score, "
                                             "SUM(credit_limit) AS credit FROM source GROUP BY region"),
    "agg_customers_by_tier": ("customers", "SELECT segment, tier, COUNT(*) AS customers, MAX(credit_limit) AS "
                                           "largest_limit FROM source WHERE active GROUP BY segment, tier"),
    "agg_customers_reach": ("customers", "SELECT region, COUNT(email) AS with_email, COUNT(DISTINCT segment) AS "
                                         "segments FROM source GROUP BY region"),
    "agg_lines_by_sku": ("line_items", "SELECT sku, SUM(quantity) AS units, SUM(quantity * unit_price) AS revenue "
                                       "FROM source GROUP BY sku"),
    "agg_lines_by_order": ("line_items", "SELECT order_id, COUNT(*) AS lines, SUM(unit_price * quantity) AS "
                                         "order_value, MAX(discount) AS largest_discount FROM source "
                                         "GROUP BY order_id"),
    "agg_lines_returns": ("line_items", "SELECT returned, COUNT(*) AS lines, AVG(discount) AS average_discount, "
                                        "MIN(shipped_at) AS first_shipped FROM source GROUP BY returned"),
    "agg_lines_returned_skus": ("line_items", "SELECT sku, COUNT(*) AS returns FROM source WHERE returned "
                                              "GROUP BY sku HAVING COUNT(*) >= 2"),
    "agg_payments_by_method": ("payments", "SELECT method, COUNT(*) AS payments, SUM(amount) AS amount, AVG(fee) AS "
                                           "average_fee FROM source GROUP BY method"),
    "agg_payments_by_customer": ("payments", "SELECT customer_code, SUM(amount) AS paid, COUNT(*) AS payments "
                                             "FROM source WHERE settled GROUP BY customer_code "
                                             "HAVING SUM(amount) > 100"),
    "agg_payments_attempts": ("payments", "SELECT attempts, COUNT(DISTINCT method) AS methods, MAX(paid_at) AS "
                                          "last_paid FROM source GROUP BY attempts"),
}
"""Name -> (upstream, query)."""

OVER_MVS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "chain_orders_open_large": ("plain_orders_open", ("order_id",),
                                "SELECT order_id, customer_code, status, amount FROM source WHERE amount > 200"),
    "chain_orders_open_by_status": ("chain_orders_open_large", ("order_id",),
                                    "SELECT status, COUNT(*) AS orders, SUM(amount) AS amount FROM source "
                                    "GROUP BY status"),
    "chain_lines_open_multi": ("plain_lines_open", ("order_id", "line_no"),
                               "SELECT order_id, line_no, sku, quantity * unit_price AS line_value FROM source "
                               "WHERE quantity >= 2"),
    "chain_lines_open_by_sku": ("chain_lines_open_multi", ("order_id", "line_no"),
                                "SELECT sku, COUNT(*) AS lines, SUM(line_value) AS value FROM source GROUP BY sku"),
    "chain_active_by_region": ("plain_customers_active", ("customer_code",),
                               "SELECT region, COUNT(*) AS customers, SUM(credit_limit) AS credit FROM source "
                               "GROUP BY region"),
    "chain_settled_by_method": ("plain_payments_settled", ("payment_id",),
                                "SELECT method, COUNT(*) AS payments, MAX(amount) AS largest FROM source "
                                "GROUP BY method"),
    "chain_large_payers": ("plain_payments_large", ("payment_id",),
                           "SELECT customer_code, COUNT(*) AS payments, SUM(amount) AS paid FROM source "
                           "GROUP BY customer_code"),
    "chain_loyal_customers": ("agg_orders_by_customer", ("customer_code",),
                              "SELECT customer_code, orders, total FROM source WHERE orders >= 3"),
}
"""Name -> (source MV, its key, query): chains of two and three MVs."""

JOINS: dict[str, tuple[dict[str, str], str]] = {
    "join_lines_orders": ({"l": "line_items", "o": "orders"},
                          "SELECT l.order_id, l.line_no, l.sku, l.quantity, o.status, o.customer_code "
                          "FROM l JOIN o ON l.order_id = o.order_id"),
    "join_orders_customers": ({"o": "orders", "c": "customers"},
                              "SELECT o.order_id, o.amount, c.region, c.segment FROM o "
                              "JOIN c ON o.customer_code = c.customer_code WHERE o.status <> 'cancelled'"),
    "join_orders_known_customers": ({"o": "orders", "c": "customers"},
                                    "SELECT o.order_id, o.status, c.customer_code AS known_customer, c.tier "
                                    "FROM o LEFT JOIN c ON o.customer_code = c.customer_code"),
    "join_payments_orders": ({"p": "payments", "o": "orders"},
                             "SELECT p.payment_id, p.amount, o.status, o.amount AS order_amount FROM p "
                             "JOIN o ON p.order_id = o.order_id"),
    "join_lines_priority": ({"l": "line_items", "o": "orders"},
                            "SELECT l.order_id, l.line_no, l.unit_price, o.priority FROM l "
                            "LEFT JOIN o ON l.order_id = o.order_id WHERE l.quantity > 2"),
    "join_revenue_by_region": ({"o": "orders", "c": "customers"},
                               "SELECT c.region, COUNT(*) AS orders, SUM(o.amount) AS revenue FROM o "
                               "JOIN c ON o.customer_code = c.customer_code GROUP BY c.region"),
    "join_units_by_status": ({"l": "line_items", "o": "orders"},
                             "SELECT o.status, COUNT(*) AS lines, SUM(l.quantity) AS units FROM l "
                             "JOIN o ON l.order_id = o.order_id GROUP BY o.status"),
}
"""Name -> (alias -> upstream, query)."""

REFUSED: dict[str, str] = {
    "SELECT c.region, MAX(o.amount) AS largest_order, COUNT(DISTINCT o.customer_code) AS buyers FROM o "
    "JOIN c ON o.customer_code = c.customer_code GROUP BY c.region":
        "MIN, MAX and COUNT(DISTINCT) over a join are refused; kept: join_revenue_by_region (COUNT, SUM)",
    "SELECT status, COUNT(*) FILTER (WHERE is_gift) AS gifts FROM source GROUP BY status":
        "aggregate FILTER clauses are refused; kept: SUM(CASE WHEN is_gift THEN 1 ELSE 0 END) in agg_orders_by_status",
}
"""Query shapes users write that the engine refuses (checked with its planner), and the
variant the mix keeps instead."""

FORWARD_SETTINGS = {"backfill_parallelism": 2, "parallelism": 1, "lag_threshold": 0, "poll_interval": 0.5}


def user_mv_declarations(lake: str) -> list[dict[str, Any]]:
    """The fifty jobs, sources before the MVs over them (a chain's order)."""
    jobs: list[dict[str, Any]] = []
    for name, (upstream, query) in {**STATELESS, **AGGREGATES}.items():
        jobs.append({"name": name, "source": f"{lake}/{upstream}", "target": f"{lake}/{name}", "query": query,
                     "primary_key": list(TABLES[upstream].key)})
    for name, (source, key, query) in OVER_MVS.items():
        jobs.append({"name": name, "source": f"{lake}/{source}", "target": f"{lake}/{name}", "query": query,
                     "primary_key": list(key)})
    for name, (aliases, query) in JOINS.items():
        sources = {alias: {"table": f"{lake}/{upstream}", "primary_key": list(TABLES[upstream].key)}
                   for alias, upstream in aliases.items()}
        jobs.append({"name": name, "target": f"{lake}/{name}", "sources": sources, "query": query})
    for job in jobs:
        job.update(FORWARD_SETTINGS)
    return jobs
