"""The upstream simulator: CDF on, one Delta version per epoch with every change type,
unique keys, deterministic given a seed, and a loop that stops when told."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake
from helpers_delta import change_feed, change_type_counts

from airflow_backfill import simulator
from airflow_backfill.exceptions import BackfillConfigError, UpstreamError
from airflow_backfill.simulator import (
    ORDERS_SCHEMA,
    commit_epoch,
    commit_epoch_counts,
    create_orders_table,
    run_simulator,
)


@pytest.fixture
def orders(tmp_path: Path) -> str:
    return str(tmp_path / "orders")


def keys(uri: str) -> list[int]:
    return DeltaTable(uri).to_pyarrow_table(columns=["order_id"]).column("order_id").to_pylist()


def sorted_rows(uri: str) -> list[dict]:
    return pa.table(DeltaTable(uri).to_pyarrow_table()).sort_by("order_id").to_pylist()


def test_create_makes_version_zero_with_the_change_feed_on(orders):
    assert create_orders_table(orders, rows=200, seed=1) == 0
    table = DeltaTable(orders)
    assert table.metadata().configuration["delta.enableChangeDataFeed"] == "true"
    assert pa.schema(table.schema().to_arrow()) == ORDERS_SCHEMA
    assert sorted(keys(orders)) == list(range(1, 201))
    rows = table.to_pyarrow_table()
    assert set(rows.column("status").to_pylist()) <= {"new", "paid", "shipped", "cancelled"}


def test_create_refuses_an_existing_table_unless_reused(orders):
    create_orders_table(orders, rows=10, seed=1)
    with pytest.raises(UpstreamError, match="already exists; pass reuse=True"):
        create_orders_table(orders, rows=10, seed=1)
    commit_epoch(orders, random.Random(0), inserts=1, updates=1, deletes=1)
    assert create_orders_table(orders, rows=10, seed=1, reuse=True) == 1


def test_reuse_refuses_a_table_without_the_change_feed(orders):
    write_deltalake(orders, pa.table({"order_id": pa.array([1], pa.int64())}))
    with pytest.raises(UpstreamError, match="Change Data Feed"):
        create_orders_table(orders, rows=10, seed=1, reuse=True)


def test_one_epoch_is_one_version_with_every_change_type(orders):
    create_orders_table(orders, rows=500, seed=2)
    before = set(keys(orders))
    version = commit_epoch(orders, random.Random(5), inserts=30, updates=40, deletes=10)

    assert version == 1 == DeltaTable(orders).version()
    assert change_type_counts(orders, 1) == {
        "insert": 30, "update_preimage": 40, "update_postimage": 40, "delete": 10,
    }
    after = keys(orders)
    assert len(after) == len(set(after)) == 500 + 30 - 10
    feed = change_feed(orders, 1)
    inserted = {row["order_id"] for row in feed.to_pylist() if row["_change_type"] == "insert"}
    deleted = {row["order_id"] for row in feed.to_pylist() if row["_change_type"] == "delete"}
    assert inserted == set(range(501, 531))
    assert deleted <= before and not deleted & set(after)


def test_updates_cancel_reinstate_and_null_amounts(orders):
    create_orders_table(orders, rows=300, seed=3)
    rng = random.Random(7)
    transitions: Counter[tuple[str, str]] = Counter()
    null_amounts = 0
    for version in range(1, 21):
        commit_epoch(orders, rng, inserts=5, updates=60, deletes=5)
        feed = change_feed(orders, version).sort_by([("order_id", "ascending"), ("_change_type", "ascending")])
        images: dict[int, dict[str, dict]] = {}
        for row in feed.to_pylist():
            images.setdefault(row["order_id"], {})[row["_change_type"]] = row
        for image in images.values():
            if "update_preimage" in image:
                pre, post = image["update_preimage"], image["update_postimage"]
                transitions[(pre["status"], post["status"])] += 1
                null_amounts += post["amount"] is None
                assert post["order_id"] == pre["order_id"] and post["customer_id"] == pre["customer_id"]
    assert any(new == "cancelled" != old for old, new in transitions)
    assert any(old == "cancelled" != new for old, new in transitions)
    assert null_amounts > 0


def test_keys_stay_unique_and_never_reused_across_epochs(orders):
    create_orders_table(orders, rows=50, seed=4)
    rng = random.Random(1)
    seen = set(keys(orders))
    for version in range(1, 16):
        commit_epoch(orders, rng, inserts=3, updates=5, deletes=8)
        feed = change_feed(orders, version)
        inserted = set(feed.filter(pc.equal(feed.column("_change_type"), "insert")).column("order_id").to_pylist())
        assert not inserted & seen, "an insert reused a key"
        seen |= inserted
        current = keys(orders)
        assert len(current) == len(set(current))


def test_deletes_and_updates_are_capped_to_existing_rows(orders):
    create_orders_table(orders, rows=3, seed=1)
    counts = commit_epoch_counts(orders, random.Random(1), inserts=0, updates=10, deletes=10)
    assert counts.version == 1
    # the largest key is kept so new keys never repeat old ones; the rest are deleted
    assert counts.deletes == 2 and counts.updates == 1
    assert keys(orders) == [3]


def test_same_seed_gives_the_same_table_and_feed(tmp_path):
    tables = [str(tmp_path / "a"), str(tmp_path / "b")]
    for uri in tables:
        create_orders_table(uri, rows=100, seed=9)
        rng = random.Random(9)
        for _ in range(3):
            commit_epoch(uri, rng, inserts=4, updates=10, deletes=3)
    assert sorted_rows(tables[0]) == sorted_rows(tables[1])
    for version in (1, 2, 3):
        columns = [*ORDERS_SCHEMA.names, "_change_type"]
        feeds = [change_feed(uri, version).select(columns).sort_by([("order_id", "ascending"),
                                                                    ("_change_type", "ascending")])
                 for uri in tables]
        assert feeds[0].to_pylist() == feeds[1].to_pylist()

    other = str(tmp_path / "c")
    create_orders_table(other, rows=100, seed=10)
    assert sorted_rows(other) != pa.table(DeltaTable(tables[0], version=0).to_pyarrow_table()).sort_by(
        "order_id").to_pylist()


def test_a_conflicting_commit_is_planned_again_and_retried(orders, monkeypatch):
    create_orders_table(orders, rows=100, seed=1)
    real_merge = simulator._merge
    calls = []

    def merge_after_another_writer(table, changes):
        calls.append(table.version())
        if len(calls) == 1:  # another writer commits between our read and our commit
            other = DeltaTable(orders)
            real_merge(other, simulator._plan_epoch(other, random.Random(99), 2, 2, 2))
        real_merge(table, changes)

    monkeypatch.setattr(simulator, "_merge", merge_after_another_writer)
    version = commit_epoch(orders, random.Random(1), inserts=5, updates=5, deletes=5)
    monkeypatch.undo()
    assert calls == [0, 1]
    assert version == 2 == DeltaTable(orders).version()
    assert change_type_counts(orders, 2)["insert"] == 5
    current = keys(orders)
    assert len(current) == len(set(current)) == 100 + 2 - 2 + 5 - 5


def test_run_simulator_creates_the_table_and_stops_after_max_epochs(orders):
    committed = run_simulator(orders, rows=100, epoch_interval=0, inserts=2, updates=3, deletes=1,
                              seed=1, max_epochs=4)
    assert committed == 4
    assert DeltaTable(orders).version() == 4


def test_run_simulator_keeps_committing_to_an_existing_table(orders):
    create_orders_table(orders, rows=100, seed=7)
    committed = run_simulator(orders, rows=999, epoch_interval=0, inserts=2, updates=3, deletes=1,
                              seed=11, max_epochs=2)
    assert committed == 2 and DeltaTable(orders).version() == 2
    assert max(keys(orders)) == 104


def test_run_simulator_stops_on_the_stop_event(orders):
    stop = threading.Event()
    result: list[int] = []
    worker = threading.Thread(target=lambda: result.append(run_simulator(
        orders, rows=50, epoch_interval=0.05, inserts=1, updates=1, deletes=1, seed=1, stop_event=stop,
    )))
    worker.start()
    deadline = time.monotonic() + 60
    while not DeltaTable.is_deltatable(orders) or DeltaTable(orders).version() < 3:
        assert worker.is_alive() and time.monotonic() < deadline, "the simulator did not commit 3 epochs"
        time.sleep(0.05)
    stop.set()
    worker.join(timeout=10)
    assert not worker.is_alive()
    assert result[0] == DeltaTable(orders).version() >= 3


@pytest.mark.parametrize("counts", [dict(inserts=0, updates=0, deletes=0), dict(inserts=-1, updates=1, deletes=0)])
def test_bad_epoch_sizes_are_refused(orders, counts):
    create_orders_table(orders, rows=10, seed=1)
    with pytest.raises(BackfillConfigError):
        commit_epoch(orders, random.Random(1), **counts)
    assert DeltaTable(orders).version() == 0
