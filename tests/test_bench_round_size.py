"""The round-size benchmark (bench/round_size.py) at a tiny size, in the tests' session: its
writer changes 500 rows of the users' `orders` in the two commits it says, the round it
times applies them, the MV it checks equals the query at its watermark, and its figure
reaches the table."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from deltalake import DeltaTable

from bench import table
from bench.round_size import DELETED, REINSERTED, UPDATED, Sized, differences, parse_sizes, timed_round
from bench.snapshot_layout import JvmClock
from bench.writers import KIND_FIELD, delta_rs_engine

pytestmark = pytest.mark.spark


def test_a_timed_round_applies_the_500_changed_rows_and_the_mv_equals_its_query(spark, tmp_path: Path) -> None:
    from airflow_backfill.engine.phases.snapshot import run_snapshot

    sized = Sized(tmp_path, 1_000, seed=5)
    run_snapshot(spark, sized.job, parallelism=2)
    clock, engine = JvmClock(), delta_rs_engine()
    deleted_first: set[int] = set()
    for _ in range(2):  # the second turn re-inserts the keys the first deleted
        version = sized.change_500_rows(engine)
        kinds = [entry.get(KIND_FIELD) for entry in DeltaTable(sized.upstream.uri).history(2)]
        assert kinds == ["upsert", "delete"]
        measured = timed_round(spark, sized, clock)
        assert measured["rounds"] == 1 and measured["plans"], measured
        # 400 updates (two images each), 50 deletes, 50 inserts: the feed holds all of them
        assert measured["change_rows"] >= 2 * UPDATED + DELETED + REINSERTED, measured
        deleted_first = deleted_first or set(sized.upstream.book.deleted)
    assert differences(sized) == 0, f"the MV differs from its query at version {version}"
    held = set(DeltaTable(sized.upstream.uri).to_pyarrow_table(columns=["order_id"]).column(0).to_pylist())
    assert len(held) == 1_000 and len(deleted_first) == DELETED  # each turn deletes 50 and inserts 50
    assert {index + 1 for index in deleted_first} <= held  # the second turn re-inserted the first turn's deletes


def test_sizes_are_one_or_two_row_counts() -> None:
    assert parse_sizes("20000,2000000") == [20_000, 2_000_000]
    for bad in ("", "20k", "10", "1000,2000,3000"):
        with pytest.raises(argparse.ArgumentTypeError, match="--sizes takes"):
            parse_sizes(bad)


def test_the_table_reads_the_large_round_and_its_ratio_to_the_small_one() -> None:
    def size(seconds: float, plain: float) -> dict:
        return {"round_median_s": seconds, "plain_median_s": plain, "rows_written_max": 480, "differences": 0}

    row = table.ROWS_BY_ANCHOR["round-500-2m"]
    figure = row.read({"round_size": {"sizes": {"20k": size(0.4, 3.0), "2m": size(0.48, 9.0)}}})
    assert figure is not None and figure.met is True
    assert figure.text.startswith("0.48 s, 1.20x of 20 k (0.40 s)")
    slow = row.read({"round_size": {"sizes": {"20k": size(0.2, 3.0), "2m": size(0.45, 9.0)}}})
    assert slow is not None and slow.met is False  # under 0.5 s, but 2.25x the small round
    assert row.read({"round_size": {"sizes": {"20k": size(0.2, 3.0)}}}) is None
