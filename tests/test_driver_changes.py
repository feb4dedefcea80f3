"""The driver's netting and mapping of a held feed give the frames Spark's `net_changes`
and `mv_changes` give, for random feeds of inserts, updates, deletes, key moves and
rewrites within a commit, with and without a WHERE, and name the same repeated key."""

from __future__ import annotations

import datetime
import random
from decimal import Decimal

import pyarrow as pa
import pytest

from airflow_backfill.engine.delta.commits import ARRIVED, REPEATED_KEY
from airflow_backfill.engine.planning.query import plan_query
from airflow_backfill.engine.rounds.changes import mv_changes, net_changes
from airflow_backfill.engine.rounds.driver_changes import RepeatedKeyInFeed, changes_in_driver

pytestmark = pytest.mark.spark

SCHEMA = ("id long, day date, status string, amount decimal(10,2), _change_type string, "
          "_commit_version long")
QUERIES = {
    "unfiltered": "SELECT id AS order_id, day, amount * 2 AS doubled FROM source",
    "filtered": "SELECT id, status, amount FROM source WHERE status <> 'cancelled'",
    "two-part key": "SELECT id, day, amount FROM source WHERE amount > 3",
}
KEYS = {"unfiltered": ("id",), "filtered": ("id",), "two-part key": ("id", "day")}


KEY_SPACE = [(i, datetime.date(2024, 1, 1 + i % 2)) for i in range(12)]


def random_feed(seed: int, *, repeat: bool = False) -> list[tuple]:
    """Change rows of a table with a unique (id, day) key over a few commits, as Delta's
    feed shows them; with `repeat`, one commit inserts a key the table holds."""
    rng = random.Random(seed)
    held: dict[tuple, tuple] = {}
    rows: list[tuple] = []

    def image(key: tuple) -> tuple:
        return (*key, rng.choice(["new", "paid", "cancelled"]), Decimal(rng.randint(0, 900)) / 100)

    for version in range(1, 6):
        touched: set[tuple] = set()  # a commit shows each row's change once
        for _ in range(rng.randint(1, 6)):
            choice = rng.random()
            free = [key for key in KEY_SPACE if key not in held and key not in touched]
            held_now = {key: row for key, row in held.items() if key not in touched}
            if (choice < 0.3 or not held_now) and free:
                key = rng.choice(free)
                held[key] = image(key)
                rows.append((*held[key], "insert", version))
                touched.add(key)
            elif choice < 0.55 and held_now:
                key = rng.choice(sorted(held_now))
                rows.append((*held.pop(key), "delete", version))
                touched.add(key)
            elif choice < 0.75 and held_now and free:  # an update that moves the row to another key
                old, new = rng.choice(sorted(held_now)), rng.choice(free)
                rows.append((*held.pop(old), "update_preimage", version))
                held[new] = (*new, *image(new)[2:])
                rows.append((*held[new], "update_postimage", version))
                touched.update((old, new))
            elif choice < 0.9 and held_now:
                key = rng.choice(sorted(held_now))
                rows.append((*held[key], "update_preimage", version))
                held[key] = image(key)
                rows.append((*held[key], "update_postimage", version))
                touched.add(key)
            elif held_now:  # rewritten within the commit: removed and added again
                key = rng.choice(sorted(held_now))
                rows.append((*held[key], "delete", version))
                rows.append((*held[key], "insert", version))
                touched.add(key)
    if repeat and held:
        key = sorted(held)[0]
        rows.append((*image(key), "insert", 6))
    return rows


def _sorted(frame) -> list[tuple]:
    return sorted((tuple(row) for row in frame.collect()), key=repr)


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_the_driver_nets_and_maps_a_feed_as_spark_does(spark, name):
    plan = plan_query(QUERIES[name], KEYS[name])
    compared = 0
    for seed in range(12):
        rows = random_feed(seed)  # each id has one day: unique under either key
        feed = spark.createDataFrame(rows, SCHEMA)
        table = pa.Table.from_pylist([row.asDict() for row in feed.collect()])
        arrivals = any(row[4] in ("insert", "update_postimage") for row in rows)
        in_driver = changes_in_driver(spark, table, feed.schema, plan, refuse_repeated_keys=True,
                                      keep_first_image=plan.filters_rows, arrivals=arrivals)
        assert in_driver is not None
        net = net_changes(feed, plan.upstream_key, keep_first_image=plan.filters_rows)
        if not arrivals:
            net = net.drop(ARRIVED)
        assert in_driver.net.columns == net.columns
        assert _sorted(in_driver.net) == _sorted(net)
        keyed = mv_changes(spark, net, plan)
        assert in_driver.keyed.columns == keyed.columns
        assert _sorted(in_driver.keyed) == _sorted(keyed)
        compared += len(rows)
    assert compared > 100


def _upstream_at(rows: list[tuple], version: int) -> list[tuple]:
    """The upstream's rows as of `version`, replayed from its change rows."""
    held: dict[tuple, tuple] = {}
    for row in rows:
        if row[-1] > version:
            break
        if row[4] in ("delete", "update_preimage"):
            held.pop(row[:2])
        else:
            held[row[:2]] = row[:4]
    return list(held.values())


@pytest.mark.parametrize("name", ["filtered", "two-part key"])
def test_the_mvs_own_rows_tell_the_keys_it_held_as_the_query_over_earlier_rows_does(spark, name):
    """A round that starts mid-history, given the MV's rows at its start (`held_mv`), keeps
    the same departures as Spark's `mv_changes` over the feed's first images; an MV whose
    key has another type is not used (the query decides)."""
    plan = plan_query(QUERIES[name], KEYS[name])
    compared = 0
    for seed in range(12):
        rows = random_feed(seed)
        start = 2
        later = [row for row in rows if row[-1] > start]
        if not later:
            continue
        upstream = spark.createDataFrame(_upstream_at(rows, start), SCHEMA.rsplit(", _change_type", 1)[0])
        upstream.createOrReplaceTempView("source")
        mv = spark.sql(plan.query)
        feed = spark.createDataFrame(later, SCHEMA)
        table = pa.Table.from_pylist([row.asDict() for row in feed.collect()])
        arrivals = any(row[4] in ("insert", "update_postimage") for row in later)
        net = net_changes(feed, plan.upstream_key, keep_first_image=True)
        if not arrivals:
            net = net.drop(ARRIVED)
        expected = _sorted(mv_changes(spark, net, plan))
        for held_mv in (mv.toArrow(), mv.withColumn("id", mv["id"].cast("int")).toArrow()):
            in_driver = changes_in_driver(spark, table, feed.schema, plan, refuse_repeated_keys=True,
                                          keep_first_image=True, arrivals=arrivals, held_mv=held_mv)
            assert in_driver is not None
            assert _sorted(in_driver.keyed) == expected
        compared += len(later)
    assert compared > 50


def test_a_repeated_key_is_named_as_spark_names_it(spark):
    plan = plan_query(QUERIES["two-part key"], KEYS["two-part key"])
    feed = spark.createDataFrame(random_feed(3, repeat=True), SCHEMA)
    table = pa.Table.from_pylist([row.asDict() for row in feed.collect()])
    with pytest.raises(RepeatedKeyInFeed) as raised:
        changes_in_driver(spark, table, feed.schema, plan, refuse_repeated_keys=True, keep_first_image=True,
                          arrivals=True)
    with pytest.raises(Exception, match=REPEATED_KEY) as in_spark:
        net_changes(feed, plan.upstream_key).collect()
    named = str(in_spark.value)[str(in_spark.value).find(REPEATED_KEY):].splitlines()[0]
    assert named.startswith(str(raised.value))


def test_keys_python_compares_otherwise_are_left_to_spark(spark):
    plan = plan_query("SELECT id, amount FROM source", ("amount",))
    feed = spark.createDataFrame([(1, 2.5, "insert", 1)], "id long, amount double, _change_type string, "
                                 "_commit_version long")
    table = pa.Table.from_pylist([row.asDict() for row in feed.collect()])
    assert changes_in_driver(spark, table, feed.schema, plan, refuse_repeated_keys=True, keep_first_image=False,
                             arrivals=True) is None
