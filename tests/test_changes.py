"""The netting of a change feed and its mapping through the MV query (pure DataFrames)."""

from __future__ import annotations

import pytest

from airflow_backfill.engine.phases.changes import mv_changes, net_changes
from airflow_backfill.engine.planning.query import plan_query

pytestmark = pytest.mark.spark

FEED_SCHEMA = "order_id long, status string, amount double, _change_type string, _commit_version long"


def test_last_image_per_key_wins_and_deletes_are_flagged(spark):
    feed = spark.createDataFrame(
        [
            (1, "new", 1.0, "insert", 3),
            (1, "new", 1.0, "update_preimage", 4),
            (1, "paid", 2.0, "update_postimage", 4),
            (2, "new", 5.0, "delete", 3),
            (2, "new", 6.0, "insert", 5),  # re-inserted later: alive
            (3, "new", 7.0, "insert", 3),
            (3, "new", 7.0, "delete", 6),
            (4, "old", 8.0, "delete", 7),  # removed and re-added in one commit: alive
            (4, "new", 9.0, "insert", 7),
        ],
        FEED_SCHEMA,
    )
    rows = {r.order_id: r for r in net_changes(feed, ("order_id",)).collect()}
    assert {k: (r["status"], r["amount"], r["__deleted"]) for k, r in rows.items()} == {
        1: ("paid", 2.0, False),
        2: ("new", 6.0, False),
        3: ("new", 7.0, True),
        4: ("new", 9.0, False),
    }


def test_keys_filtered_out_or_deleted_leave_the_mv(spark):
    plan = plan_query(
        "SELECT order_id AS id, amount * 2 AS doubled FROM source WHERE status <> 'cancelled'",
        ("order_id",),
    )
    feed = spark.createDataFrame(
        [
            (1, "paid", 1.5, "insert", 1),
            (2, "cancelled", 2.0, "update_postimage", 1),
            (2, "paid", 2.0, "update_preimage", 1),
            (3, "paid", 3.0, "delete", 1),
        ],
        FEED_SCHEMA,
    )
    changes = mv_changes(spark, net_changes(feed, plan.upstream_key), plan)
    assert changes.columns == ["id", "doubled", "__present"]
    assert sorted(tuple(r) for r in changes.collect()) == [(1, 3.0, True), (2, None, None), (3, None, None)]
