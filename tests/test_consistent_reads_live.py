"""Consistent reads across three MVs over two live upstreams, one MV over another MV.

`orders` (the simulator) and `customer` keep committing, never pausing, while the MVs are
built and kept up to date; their jobs' `round_alignment` makes forward commit only at
multiples of a few epochs, so the MVs keep committing the same epochs while each goes at
its own pace. At every check, the versions `common` returns
must reflect one epoch of each upstream, and a dashboard query over the three MVs at those
versions must equal the same query over the MVs' queries recomputed independently (DuckDB)
on the upstreams at those epochs. Each MV at its version is also compared alone."""

from __future__ import annotations

import random
import threading
import time

import duckdb
import pyarrow as pa
import pytest
import sqlglot
from join_upstreams import create, initial_rows, random_epoch

from airflow_backfill.consistent_reads import consistent_versions
from airflow_backfill.engine.consistency.readers import read_arrow, spark_dataframes
from airflow_backfill.engine.phases.forward import run_forward
from airflow_backfill.engine.phases.snapshot import run_snapshot
from airflow_backfill.exceptions import NotYetConsistentError
from airflow_backfill.job import BackfillJob
from airflow_backfill.simulator import commit_epoch, create_orders_table
from oracle import assert_rows_match, expected_join_rows, expected_rows

pytestmark = pytest.mark.spark

ORDERS_MV = "SELECT order_id, customer_id, status, amount * quantity AS total FROM source WHERE status <> 'cancelled'"
SEGMENT_TOTALS = ("SELECT customer.c_segment, COUNT(*) AS orders, SUM(orders.amount * orders.quantity) AS total "
                  "FROM orders JOIN customer ON orders.customer_id = customer.c_id GROUP BY customer.c_segment")
REVENUE_BY_CUSTOMER = "SELECT customer_id, COUNT(*) AS orders, SUM(total) AS revenue FROM source GROUP BY customer_id"
DASHBOARD = """
    SELECT r.customer_id, r.orders, r.revenue, m.n, m.total, s.segments_total
    FROM revenue_by_customer r
    LEFT JOIN (SELECT customer_id, COUNT(*) AS n, SUM(total) AS total FROM orders_mv GROUP BY customer_id) m
      ON r.customer_id = m.customer_id
    CROSS JOIN (SELECT SUM(total) AS segments_total, SUM(orders) AS segment_orders FROM segment_totals) s
"""
"""One query over the three MVs, as a dashboard would run it."""
CHECKS = 3
ALIGNMENT = 20
"""Upstream epochs between the epochs every MV commits (`round_alignment`): 4 s of writes,
more than a forward round takes."""
NEWER_WITHIN_S = 180


class LiveWriters(threading.Thread):
    """Commits to `orders` every 0.2 s and to `customer` every other time, until stopped."""

    def __init__(self, orders: str, customer) -> None:
        super().__init__(daemon=True)
        self.orders, self.customer = orders, customer
        self.rng = random.Random(17)
        self.stop = threading.Event()
        self.commits = 0

    def run(self) -> None:
        while not self.stop.wait(0.2):
            commit_epoch(self.orders, self.rng, inserts=8, updates=12, deletes=3)
            if self.commits % 2:
                random_epoch(self.customer, self.rng)
            self.commits += 1


def duckdb_query(sql: str, tables: dict[str, pa.Table]) -> pa.Table:
    """`sql` (Spark SQL) run by DuckDB over `tables`, by name."""
    connection = duckdb.connect()
    try:
        connection.execute("SET TimeZone = 'UTC'")
        for name, table in tables.items():
            connection.register(name, table)
        return pa.table(connection.sql(sqlglot.transpile(sql, read="spark", write="duckdb")[0]).to_arrow_table())
    finally:
        connection.close()


def recomputed(orders: str, customer: str, epochs: dict[str, int]) -> dict[str, pa.Table]:
    """Each MV's query evaluated on the upstreams at `epochs`; the MV over an MV over the
    recomputed first MV, never over the MV itself."""
    orders_mv = expected_rows(orders, epochs[orders], ORDERS_MV)
    return {
        "orders_mv": orders_mv,
        "segment_totals": expected_join_rows({"orders": orders, "customer": customer},
                                             {"orders": epochs[orders], "customer": epochs[customer]}, SEGMENT_TOTALS),
        "revenue_by_customer": duckdb_query(REVENUE_BY_CUSTOMER, {"source": orders_mv}),
    }


def test_three_mvs_read_at_the_returned_versions_equal_their_queries_at_one_epoch_of_each_upstream(spark, tmp_path):
    root = str(tmp_path)
    orders = f"{root}/orders"
    create_orders_table(orders, rows=300, seed=3)
    customer = create(root, "customer", initial_rows("customer", random.Random(3), 8))
    common = dict(lag_threshold=0, poll_interval=0.05, backfill_parallelism=2, parallelism=1, round_alignment=ALIGNMENT)
    orders_mv = BackfillJob(name="orders_mv", source=orders, target=f"{root}/orders_mv", query=ORDERS_MV,
                            primary_key=["order_id"], **common)
    segment_totals = BackfillJob(name="segment_totals", target=f"{root}/segment_totals", query=SEGMENT_TOTALS,
                                 sources={"orders": {"table": orders, "primary_key": ["order_id"]},
                                          "customer": {"table": customer.uri, "primary_key": ["c_id"]}}, **common)
    revenue = BackfillJob(name="revenue_by_customer", source=orders_mv.target, target=f"{root}/revenue_by_customer",
                          query=REVENUE_BY_CUSTOMER, primary_key=["order_id"], **common)
    mvs = (orders_mv, segment_totals, revenue)  # an MV over an MV after its upstream

    writers = LiveWriters(orders, customer)
    writers.start()
    stop_forward = threading.Event()
    forwards = [threading.Thread(target=run_forward, args=(spark.newSession(), job), kwargs={"stop": stop_forward},
                                 daemon=True) for job in mvs]  # a session each: their temporary views apart
    seen: list[dict[str, int]] = []
    try:
        for job in mvs:
            run_snapshot(spark, job)
        for forward in forwards:  # each MV kept fresh as its own forward task keeps it
            forward.start()
        for check in range(CHECKS):
            answer = newer_answer(list(mvs), seen[-1] if seen else None)
            seen.append(answer.epochs)
            check_answer(answer, orders, customer.uri)
            if check == 1:  # live writes moved the MVs past the answer: Spark reads its versions (versionAsOf)
                frames = spark_dataframes(spark, answer)
                for name, frame in frames.items():
                    assert_rows_match(read_arrow(answer, name), frame.toArrow(), context=f"{name} read by Spark")
    finally:
        stop_forward.set()
        for forward in forwards:
            forward.join(timeout=120)
        writers.stop.set()
        writers.join(timeout=30)

    assert writers.commits >= CHECKS, "the upstreams did not keep committing"
    assert all(set(epochs) == {orders, customer.uri} for epochs in seen)
    assert all(earlier[orders] <= later[orders] and earlier[customer.uri] <= later[customer.uri]
               for earlier, later in zip(seen, seen[1:], strict=False)), seen
    assert len({tuple(sorted(epochs.items())) for epochs in seen}) >= 2, f"the MVs never met again: {seen}"


def newer_answer(mvs: list[BackfillJob], before: dict[str, int] | None):
    """The `common` answer once the MVs share an epoch newer than `before` (bounded wait)."""
    deadline = time.monotonic() + NEWER_WITHIN_S
    while True:
        try:
            answer = consistent_versions(mvs)
            if before is None or answer.epochs != before:
                return answer
        except NotYetConsistentError:  # an MV has not committed a multiple yet
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise AssertionError(f"the MVs shared no epoch newer than {before} within {NEWER_WITHIN_S} s")
        time.sleep(0.5)


def check_answer(answer, orders: str, customer: str) -> None:
    """The versions reflect one epoch of each upstream, and what they hold is what the
    queries give on the upstreams at those epochs."""
    assert answer.agree and answer.left_out == []
    for table in answer.tables.values():
        assert all(answer.epochs[base] == epoch for base, epoch in table.epochs.items()), (table, answer.epochs)
    read = {name: read_arrow(answer, name) for name in answer.tables}
    expected = recomputed(orders, customer, answer.epochs)
    for name in read:
        assert_rows_match(expected[name], read[name], context=f"{name} at version {answer.version(name)}")
    assert_rows_match(duckdb_query(DASHBOARD, expected), duckdb_query(DASHBOARD, read),
                      context=f"the dashboard query at {answer.epochs}")
