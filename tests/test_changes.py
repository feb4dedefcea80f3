"""The netting of a change feed and its mapping through the MV query (pure DataFrames)."""

from __future__ import annotations

import pytest

from airflow_backfill.engine.delta.commits import REPEATED_KEY
from airflow_backfill.engine.planning.query import plan_query
from airflow_backfill.engine.rounds.changes import (
    count_changes,
    mv_changes,
    net_changes,
    some_key_gained_rows,
)

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
    assert changes.columns == ["id", "doubled", "__present", "__arrived"]
    assert sorted(tuple(r) for r in changes.collect()) == [
        (1, 3.0, True, True), (2, None, None, False), (3, None, None, False)]


@pytest.mark.parametrize(
    "history",
    [
        [("insert", 3), ("insert", 3)],  # two rows with the key arrive in one commit
        [("insert", 3), ("insert", 5)],  # a second row arrives while the first stays
        [("delete", 3), ("insert", 5), ("insert", 5)],  # the key leaves once, comes back twice
        [("delete", 3), ("delete", 3)],  # two rows held before the range leave together
        [("insert", 3), ("insert", 3), ("delete", 5)],  # held twice, then once: unique again at the end
    ],
)
def test_a_key_the_feed_shows_held_twice_is_refused(spark, history):
    from pyspark.errors import PySparkException

    feed = spark.createDataFrame(
        [(7, "new", 1.0, change, version) for change, version in history] + [(8, "new", 2.0, "insert", 3)],
        FEED_SCHEMA,
    )
    with pytest.raises(PySparkException, match=f"{REPEATED_KEY}order_id=7"):
        net_changes(feed, ("order_id",)).collect()
    assert len(net_changes(feed, ("order_id",), refuse_repeated_keys=False).collect()) == 2  # netted silently


def test_a_unique_key_rewritten_in_every_way_is_not_refused(spark):
    feed = spark.createDataFrame(
        [
            (1, "new", 1.0, "delete", 3), (1, "new", 1.0, "insert", 4),  # gone, back
            (1, "new", 1.0, "update_preimage", 5), (1, "paid", 2.0, "update_postimage", 5),
            (1, "paid", 2.0, "delete", 6), (1, "paid", 2.0, "insert", 6),  # a file rewrite
            (1, "paid", 2.0, "delete", 7),
            (2, "new", 1.0, "insert", 3), (2, "new", 1.0, "delete", 4), (2, "new", 3.0, "insert", 5),
        ],
        FEED_SCHEMA,
    )
    rows = {r.order_id: r["__deleted"] for r in net_changes(feed, ("order_id",)).collect()}
    assert rows == {1: True, 2: False}


def test_keys_the_where_left_out_before_and_after_do_not_change_the_mv(spark):
    plan = plan_query(
        "SELECT order_id AS id, amount * 2 AS doubled FROM source WHERE status <> 'cancelled'",
        ("order_id",),
    )
    feed = spark.createDataFrame(
        [
            (1, "cancelled", 1.0, "update_preimage", 1),  # left out before and after: no MV change
            (1, "cancelled", 2.0, "update_postimage", 1),
            (2, "paid", 2.0, "update_preimage", 1),  # held, then filtered out: leaves the MV
            (2, "cancelled", 2.0, "update_postimage", 1),
            (3, "cancelled", 3.0, "update_preimage", 1),  # filtered out, then held: enters
            (3, "paid", 3.0, "update_postimage", 2),
            (4, "paid", 4.0, "insert", 1),  # arrives and leaves within the range: never held
            (4, "paid", 4.0, "delete", 2),
            (5, "cancelled", 5.0, "insert", 1),  # arrives filtered out: kept, its key is checked
            (6, "paid", 6.0, "delete", 2),  # held, then deleted: leaves
            (7, "paid", 7.0, "update_preimage", 1),  # held before, filtered out, held again
            (7, "cancelled", 7.0, "update_postimage", 1),
            (7, "cancelled", 7.0, "update_preimage", 2),
            (7, "paid", 8.0, "update_postimage", 2),
        ],
        FEED_SCHEMA,
    )
    net = net_changes(feed, plan.upstream_key, keep_first_image=True)
    changes = mv_changes(spark, net, plan)
    assert changes.columns == ["id", "doubled", "__present", "__arrived"]
    assert sorted(tuple(r) for r in changes.collect()) == [
        (2, None, None, False), (3, 6.0, True, False), (5, None, None, True), (6, None, None, False),
        (7, 16.0, True, False)]
    # Without the rows before the range every departure is kept, held or not.
    kept = mv_changes(spark, net_changes(feed, plan.upstream_key), plan)
    assert sorted(r["id"] for r in kept.collect()) == [1, 2, 3, 4, 5, 6, 7]


def test_the_feed_is_counted_with_the_rows_it_brings_in(spark):
    feed = spark.createDataFrame(
        [(1, "a", 1.0, "insert", 1), (2, "a", 1.0, "update_preimage", 1), (2, "b", 1.0, "update_postimage", 1),
         (3, "a", 1.0, "delete", 2)],
        FEED_SCHEMA,
    )
    assert count_changes(feed) == (4, 2)
    assert count_changes(feed.filter("_change_type = 'delete'")) == (1, 0)


@pytest.mark.parametrize(("history", "gained"), [
    ([(1, "update_preimage", 1), (1, "update_postimage", 1), (2, "delete", 2)], False),  # in place, and a delete
    ([(1, "delete", 1), (1, "insert", 2)], False),  # deleted, then inserted again
    ([(1, "update_preimage", 1), (5, "update_postimage", 1)], True),  # moved onto key 5
    ([(2, "delete", 1), (5, "insert", 2)], True),  # a new key: only the upstream can say if it was held
])
def test_a_key_gains_rows_when_its_change_rows_bring_in_more_than_they_take_out(spark, history, gained):
    feed = spark.createDataFrame([(key, "paid", 1.0, kind, version) for key, kind, version in history], FEED_SCHEMA)
    assert some_key_gained_rows(feed, ["order_id"]) is gained
