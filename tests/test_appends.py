"""Rounds over epochs that only appended rows: told apart from the upstream's log, applied
as one append of the MV query over the added files when every added key lies above the
MV's largest key, and through the change feed otherwise; exact either way. An
upstream key held twice is refused on either path before anything is committed."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import DeltaError
from helpers_delta import append_orders, delete_orders, largest_order, mv_commits, round_plans
from size_overrides import set_sizes

from airflow_backfill.engine.delta.appends import appended_prefix
from airflow_backfill.engine.delta.change_feed import read_change_feed
from airflow_backfill.engine.delta.driver_feed import feed_in_driver
from airflow_backfill.engine.delta.log import read_watermark
from airflow_backfill.engine.phases.catch_up import run_catch_up
from airflow_backfill.engine.phases.snapshot import run_snapshot
from airflow_backfill.engine.rounds import feed as round_feed
from airflow_backfill.engine.rounds import key_check as repeated_keys
from airflow_backfill.exceptions import UpstreamError
from airflow_backfill.job import BackfillJob
from airflow_backfill.simulator import commit_epoch, create_orders_table
from oracle import assert_every_commit_matches, mv_rows

INCREMENTAL_WAYS = ("patch", "replace", "merge", "overwrite")
QUERY = "SELECT order_id, customer_id, amount FROM source WHERE status <> 'cancelled'"
UNFILTERED = "SELECT order_id, customer_id, amount FROM source"


def order_id_field(uri: str) -> pa.Field:
    return pa.schema(DeltaTable(uri).schema().to_arrow()).field("order_id")


def snapshotted_mv(spark, tables, *, rows: int, seed: int, query: str = QUERY, **settings) -> tuple[BackfillJob, int]:
    """An orders MV snapshotted over a fresh upstream, and the upstream's largest order id."""
    create_orders_table(tables["source"], rows=rows, seed=seed)
    job = BackfillJob(name="orders_mv", query=query, primary_key=["order_id"], lag_threshold=0,
                      backfill_parallelism=1, parallelism=1, **settings, **tables)
    run_snapshot(spark, job)
    return job, largest_order(tables["source"])


def assert_refused_without_a_commit(spark, job: BackfillJob, reason: str) -> None:
    """Catch-up fails with an error matching `reason` and leaves the MV as it was."""
    before = (read_watermark(job.target, job.app_id), mv_rows(job.target))
    with pytest.raises(UpstreamError, match=reason + ".*nothing was committed"):
        run_catch_up(spark, job)
    assert (read_watermark(job.target, job.app_id), mv_rows(job.target)) == before


def test_a_range_of_appends_is_read_from_the_log(tables):
    source = tables["source"]
    create_orders_table(source, rows=50, seed=1)
    top = largest_order(source)
    first = append_orders(source, [top + 1, top + 2])
    append_orders(source, [top + 7, top + 3, top + 5])

    appended = appended_prefix(source, first - 1, first + 1, order_id_field(source))

    assert appended is not None
    assert appended.end_version == first + 1
    assert len(appended.paths) == 2
    assert (appended.keys.low, appended.keys.high, appended.keys.present_rows) == (top + 1, top + 7, 5)
    assert not appended.keys.has_nulls


def test_the_append_only_prefix_ends_at_the_first_update_or_delete(tables):
    source = tables["source"]
    create_orders_table(source, rows=50, seed=2)
    top = largest_order(source)
    first = append_orders(source, [top + 1])
    commit_epoch(source, random.Random(3), inserts=0, updates=3, deletes=1)
    append_orders(source, [top + 2])

    prefix = appended_prefix(source, first - 1, first + 2, order_id_field(source))

    assert prefix is not None
    assert (prefix.end_version, prefix.keys.present_rows, len(prefix.paths)) == (first, 1, 1)
    assert appended_prefix(source, first, first + 2, order_id_field(source)) is None


@pytest.mark.spark
def test_appends_above_the_mv_are_appended_and_others_merged_each_exact(spark, tables, monkeypatch):
    source = tables["source"]
    job, top = snapshotted_mv(spark, tables, rows=200, seed=4, max_round_epochs=2)
    append_orders(source, [top + 1, top + 2, top + 3])
    append_orders(source, [top + 4])
    # Below the MV's largest key (a gap in the ids): the keys may meet rows of the MV, so MERGE.
    append_orders(source, [top - 1000, top + 5])

    feed_reads = []
    monkeypatch.setattr(round_feed, "read_change_feed", lambda *args: feed_reads.append(args[2:4]) or read_change_feed(*args))
    monkeypatch.setattr(round_feed, "feed_in_driver", lambda *args: feed_reads.append(args[2:4]) or feed_in_driver(*args))

    result = run_catch_up(spark, job)

    # the appends were not read as a feed (read by the driver, or by Spark when it declines)
    assert set(feed_reads) == {(result.watermark - 1, result.watermark)}
    assert result.watermark == DeltaTable(source).version()
    operations = [(c["operation"], c["airflow_backfill.phase"]) for c in mv_commits(job.target)]
    assert operations[1] == ("WRITE", "catch_up")
    assert round_plans(job.target)[0] == "append" and round_plans(job.target)[1] in INCREMENTAL_WAYS
    assert assert_every_commit_matches(source, job.target, QUERY, job.app_id, key=["order_id"]) == 3


@pytest.mark.spark
@pytest.mark.parametrize("checked_by", ["driver", "spark"])
def test_an_append_that_repeats_a_key_is_refused_before_anything_is_committed(spark, tables, monkeypatch, checked_by):
    source = tables["source"]
    job, top = snapshotted_mv(spark, tables, rows=60, seed=5)
    if checked_by == "spark":  # more appended rows than the driver reads
        set_sizes(monkeypatch, key_check_rows=0)
    append_orders(source, [top + 1, top + 2])
    append_orders(source, [top + 3, top + 1])  # an upstream whose key is not unique, across two files

    # Above the upstream's largest key: no earlier row can hold them, the added rows tell.
    assert_refused_without_a_commit(spark, job, rf"not unique in the upstream.*order_id={top + 1} is held 2 times at epoch")


@pytest.mark.spark
def test_a_key_the_change_feed_shows_held_twice_is_refused_before_anything_is_committed(spark, tables):
    source = tables["source"]
    job, _ = snapshotted_mv(spark, tables, rows=60, seed=7, query=UNFILTERED)  # no WHERE: the netting refuses
    smallest = min(DeltaTable(source).to_pyarrow_table(columns=["order_id"]).column("order_id").to_pylist())
    gone = delete_orders(source, 1)  # deletes `smallest`
    append_orders(source, [smallest, smallest])  # below the MV's largest key: the feed path

    assert_refused_without_a_commit(spark, job, rf"order_id={smallest} is held twice between epochs {gone} and {gone + 1}")


@pytest.mark.spark
@pytest.mark.parametrize(("query", "status", "reason"), [
    (UNFILTERED, "paid", "is held twice between epochs"),  # the MERGE finds the MV's row
    (QUERY, "paid", "is held 2 times at epoch"),  # a WHERE: the upstream is asked first
    (QUERY, "cancelled", "is held 2 times at epoch"),  # the second row filtered out
], ids=["no_where", "where", "where_second_row_filtered"])
def test_a_second_row_for_a_key_the_mv_holds_is_refused_before_anything_is_committed(
        spark, tables, query, status, reason):
    source = tables["source"]
    job, _ = snapshotted_mv(spark, tables, rows=60, seed=8, query=query)
    held = min(mv_rows(job.target).column("order_id").to_pylist())
    append_order(source, held, status)

    assert_refused_without_a_commit(spark, job, rf"order_id={held} {reason}")


@pytest.mark.spark
@pytest.mark.parametrize("path", ["feed", "append", "moved"])
def test_a_second_row_for_a_key_the_query_filtered_out_is_refused_before_anything_is_committed(spark, tables, path):
    """The MV lacks the key's first row, so only the upstream can tell it is held twice."""
    source = tables["source"]
    job, top = snapshotted_mv(spark, tables, rows=60, seed=9)
    if path == "append":  # above the MV's largest key: a round of appends
        hidden = top + 1
        append_order(source, hidden, "cancelled")
        run_catch_up(spark, job)
    else:  # below it: the change feed and the MERGE
        upstream = DeltaTable(source).to_pyarrow_table(columns=["order_id", "status"]).to_pylist()
        hidden = min(row["order_id"] for row in upstream if row["status"] == "cancelled")
        assert hidden not in mv_rows(job.target).column("order_id").to_pylist()
    if path == "moved":  # an update moves a row of the MV onto the key: an update post-image, no insert
        version = move_order(source, max(mv_rows(job.target).column("order_id").to_pylist()), hidden)
    else:
        version = append_order(source, hidden, "paid")

    assert_refused_without_a_commit(spark, job, rf"order_id={hidden} is held 2 times at epoch {version}")


@pytest.mark.spark
@pytest.mark.parametrize("repeated", [False, True], ids=["new_keys", "a_new_key_twice"])
def test_keys_arriving_above_the_upstreams_largest_are_proved_by_the_feed_alone(spark, tables, monkeypatch, repeated):
    """With a WHERE, keys that arrive in a feed round above every key the upstream held at
    the watermark have all their rows in the feed: the upstream is not read, and a key
    inserted twice is still refused by the netting."""
    source = tables["source"]
    job, top = snapshotted_mv(spark, tables, rows=80, seed=11)
    commit_epoch(source, random.Random(12), inserts=0, updates=3, deletes=1)  # the round reads the feed
    append_order(source, top + 1, "cancelled")
    append_order(source, top + 1 if repeated else top + 2, "paid")
    upstream_reads = []
    monkeypatch.setattr(repeated_keys, "refuse_keys_held_twice", lambda *args, **kwargs: upstream_reads.append(args))

    if repeated:
        assert_refused_without_a_commit(spark, job, rf"order_id={top + 1} is held twice between epochs")
    else:
        run_catch_up(spark, job)
        assert assert_every_commit_matches(source, job.target, QUERY, job.app_id, key=["order_id"]) == 2
    assert upstream_reads == []


@pytest.mark.spark
def test_keys_above_the_largest_are_looked_up_when_the_watermarks_version_cannot_be_loaded(spark, tables, monkeypatch):
    """Without the statistics at the watermark nothing is known: the upstream is asked (its
    files looked up by the driver, or read by Spark)."""
    source = tables["source"]
    job, top = snapshotted_mv(spark, tables, rows=80, seed=13)
    commit_epoch(source, random.Random(14), inserts=0, updates=3, deletes=1)
    append_order(source, top + 1, "paid")

    def log_gone(*_args, **_kwargs):
        raise DeltaError("Invalid table version")

    monkeypatch.setattr(repeated_keys, "table_key_max", log_gone)
    asked = []
    ask, look_up = repeated_keys.refuse_keys_held_twice, repeated_keys.refused_by_driver
    monkeypatch.setattr(repeated_keys, "refuse_keys_held_twice", lambda *args, **kwargs: asked.append(args) or ask(*args, **kwargs))
    monkeypatch.setattr(repeated_keys, "refused_by_driver", lambda *args, **kwargs: asked.append(args) or look_up(*args, **kwargs))

    run_catch_up(spark, job)

    assert len(asked) == 1
    assert assert_every_commit_matches(source, job.target, QUERY, job.app_id, key=["order_id"]) == 2


@pytest.mark.spark
def test_an_update_that_moves_a_row_onto_a_new_key_is_applied(spark, tables):
    source = tables["source"]
    job, top = snapshotted_mv(spark, tables, rows=60, seed=10)
    moved = max(mv_rows(job.target).column("order_id").to_pylist())
    move_order(source, moved, top + 10)

    run_catch_up(spark, job)

    keys = mv_rows(job.target).column("order_id").to_pylist()
    assert top + 10 in keys and moved not in keys
    assert assert_every_commit_matches(source, job.target, QUERY, job.app_id, key=["order_id"]) == 2


def move_order(source: str, order_id: int, new_order_id: int) -> int:
    """Change the key of order `order_id` to `new_order_id` in one update; its version."""
    DeltaTable(source).update(updates={"order_id": str(new_order_id)}, predicate=f"order_id = {order_id}")
    return DeltaTable(source).version()


def append_order(source: str, order_id: int, status: str) -> int:
    """Append a copy of an existing order under `order_id` with `status`; its version."""
    rows = DeltaTable(source).to_pyarrow_table().slice(0, 1)
    rows = rows.set_column(rows.schema.get_field_index("order_id"), rows.schema.field("order_id"),
                           pa.array([order_id], rows.schema.field("order_id").type))
    rows = rows.set_column(rows.schema.get_field_index("status"), rows.schema.field("status"),
                           pa.array([status], rows.schema.field("status").type))
    write_deltalake(source, rows, mode="append")
    return DeltaTable(source).version()


@pytest.mark.spark
def test_appends_before_deletes_are_a_round_of_their_own(spark, tables):
    source = tables["source"]
    job, top = snapshotted_mv(spark, tables, rows=120, seed=6)
    append_orders(source, [top + 1, top + 2])
    append_orders(source, [top + 3])
    deleted = delete_orders(source, 4)

    result = run_catch_up(spark, job)

    assert [r.watermark for r in result.rounds] == [deleted - 1, deleted]
    plans = round_plans(job.target)  # the delete round of so small an MV may recompute before its feed
    assert plans[0] == "append" and plans[1] in (*INCREMENTAL_WAYS, "recompute")
    assert assert_every_commit_matches(source, job.target, QUERY, job.app_id, key=["order_id"]) == 3
