"""Bounded catch-up rounds: a backlog becomes several commits of at most N epochs (or about
B change bytes), each one exact at its watermark, and the lag shrinks round by round."""

from __future__ import annotations

import random

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from helpers_delta import mv_commits

from airflow_backfill.engine.control import write_overrides
from airflow_backfill.engine.delta.change_feed import change_bytes, range_inserts_rows, round_end
from airflow_backfill.engine.phases.catch_up import run_catch_up
from airflow_backfill.engine.phases.snapshot import run_snapshot
from airflow_backfill.job import BackfillJob
from airflow_backfill.simulator import commit_epoch, create_orders_table
from oracle import assert_every_commit_matches

pytestmark = pytest.mark.spark

QUERY = "SELECT order_id, customer_id, amount FROM source WHERE status <> 'cancelled'"


def backlog(uri: str, epochs: int, seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(epochs):
        commit_epoch(uri, rng, inserts=5, updates=8, deletes=2)


def make_job(tables: dict[str, str], **fields) -> BackfillJob:
    return BackfillJob(name="orders_mv", query=QUERY, primary_key=["order_id"], lag_threshold=0,
                       backfill_parallelism=1, parallelism=1, **tables, **fields)


def test_round_end_respects_epoch_and_byte_bounds(tables):
    create_orders_table(tables["source"], rows=200, seed=1)
    backlog(tables["source"], 6, seed=2)
    sizes = [change_bytes(tables["source"], version) for version in range(1, 7)]
    assert all(size > 0 for size in sizes)
    assert round_end(tables["source"], 0, 6, max_epochs=None, max_bytes=None) == 6
    assert round_end(tables["source"], 0, 6, max_epochs=4, max_bytes=None) == 4
    assert round_end(tables["source"], 4, 6, max_epochs=4, max_bytes=None) == 6
    # The byte cap stops before the epoch that crosses it, but always takes one epoch.
    assert round_end(tables["source"], 0, 6, max_epochs=None, max_bytes=sizes[0] + sizes[1]) == 2
    assert round_end(tables["source"], 0, 6, max_epochs=None, max_bytes=1) == 1
    # Aligned rounds end at the range's last multiple, when it holds one.
    assert round_end(tables["source"], 0, 6, max_epochs=None, max_bytes=None, alignment=4) == 4
    assert round_end(tables["source"], 4, 6, max_epochs=None, max_bytes=None, alignment=4) == 6
    assert round_end(tables["source"], 1, 6, max_epochs=2, max_bytes=None, alignment=4) == 3


def test_aligned_ends_let_mvs_at_different_watermarks_meet():
    """Two MVs over one upstream at watermarks 7 and 12, the upstream at 23, then 27: each
    one's rounds end at multiples of 10 first, so both commit epoch 20."""
    from airflow_backfill.engine.delta.change_feed import aligned_end

    first, second = aligned_end(7, 23, 10), aligned_end(12, 23, 10)
    assert first == second == 20
    assert aligned_end(20, 27, 10) == 27 and aligned_end(20, 29, None) == 29


def test_a_backlog_is_applied_in_bounded_commits_each_exact(spark, tables):
    create_orders_table(tables["source"], rows=300, seed=3)
    job = make_job(tables, max_round_epochs=3)
    snapshot = run_snapshot(spark, job)
    backlog(tables["source"], 8, seed=4)

    result = run_catch_up(spark, job)

    assert result.watermark == snapshot.epoch + 8
    assert [r.pending_epochs for r in result.rounds] == [8, 5, 2]
    epochs = [int(c["airflow_backfill.epoch"]) for c in mv_commits(job.target) if c["airflow_backfill.phase"] == "catch_up"]
    assert epochs == [snapshot.epoch + 3, snapshot.epoch + 6, snapshot.epoch + 8]
    assert assert_every_commit_matches(job.source, job.target, QUERY, job.app_id, key=["order_id"]) == 4


def test_a_round_bound_altered_live_applies_from_the_next_round(spark, tables):
    create_orders_table(tables["source"], rows=300, seed=5)
    job = make_job(tables)
    snapshot = run_snapshot(spark, job)
    backlog(tables["source"], 4, seed=6)
    write_overrides(job.target, max_round_bytes=1)  # every round then takes exactly one epoch

    result = run_catch_up(spark, job)

    assert [r.pending_epochs for r in result.rounds] == [4, 3, 2, 1]
    assert result.watermark == snapshot.epoch + 4
    assert_every_commit_matches(job.source, job.target, QUERY, job.app_id, key=["order_id"])


def test_the_log_tells_which_ranges_inserted_no_row(spark, tables):
    """UPDATE, DELETE and a MERGE without inserts (delta-rs' and delta-spark's metric names)
    insert no row; an append or a MERGE that inserts does."""
    from deltalake import DeltaTable

    source = tables["source"]
    create_orders_table(source, rows=20, seed=3)  # version 0
    upstream = DeltaTable(source)
    upstream.update(updates={"amount": "amount + 1"}, predicate="order_id < 5")  # 1
    upstream.delete("order_id = 6")  # 2
    changed = upstream.to_pyarrow_table().filter(pc.equal(upstream.to_pyarrow_table()["order_id"], 7))
    upstream.merge(changed, "t.order_id = s.order_id", source_alias="s", target_alias="t") \
        .when_matched_update_all().execute()  # 3
    spark.sql(f"UPDATE delta.`{source}` SET amount = amount + 1 WHERE order_id = 9")  # 4
    spark.sql(f"MERGE INTO delta.`{source}` t USING (SELECT * FROM delta.`{source}` WHERE order_id = 10) s "
              "ON t.order_id = s.order_id WHEN MATCHED THEN DELETE WHEN NOT MATCHED THEN INSERT *")  # 5: deletes
    assert not range_inserts_rows(source, 0, 5)
    DeltaTable(source).merge(changed.set_column(0, "order_id", pa.array([1000], changed.schema.field("order_id").type)),
                   "t.order_id = s.order_id", source_alias="s", target_alias="t") \
        .when_not_matched_insert_all().execute()  # 6
    assert range_inserts_rows(source, 5, 6)
    commit_epoch(source, random.Random(1), inserts=1, updates=0, deletes=0)  # 7: an append
    assert range_inserts_rows(source, 6, 7)
    assert not range_inserts_rows(source, 0, 4)
