"""The driver's proof of a unique integer key with one bit per possible key: it proves
keys held once in any row order, and never a key held twice (in a batch, across batches
or files), a NULL part, a value its range does not cover, or a range too large."""

from __future__ import annotations

import pytest
from helpers_delta import parquet_parts
from size_overrides import set_sizes

from airflow_backfill.engine.delta.dense_keys import fits, keys_unique_in_range
from airflow_backfill.engine.sizes import sizes


def test_keys_held_once_in_any_order_are_proved(tmp_path):
    paths = parquet_parts(tmp_path, {"k": [9, 1, 5, 2], "n": [1, 1, 1, 7]}, {"k": [5, 1], "n": [7, 2]}, {"k": [], "n": []})
    assert keys_unique_in_range(paths, ["k", "n"], [(1, 9), (1, 7)], batch_rows=2)
    # (1, 2) and (2, 1) are different keys: the parts are combined by position, not summed
    assert keys_unique_in_range(parquet_parts(tmp_path, {"k": [1, 2], "n": [2, 1]}), ["k", "n"], [(1, 2), (1, 2)])


@pytest.mark.parametrize("tables", [
    ({"k": [3, 1, 3], "n": [1, 1, 1]},),  # twice in a batch
    ({"k": [3, 1, 2, 3], "n": [1, 1, 1, 1]},),  # twice across batches of 2 rows
    ({"k": [1, 2], "n": [1, 1]}, {"k": [4, 2], "n": [1, 1]}),  # twice across files
    ({"k": [1, 2, 3], "n": [1, None, 1]},),  # a NULL part
    ({"k": [1, 2, 30], "n": [1, 1, 1]},),  # a value beyond the range the statistics gave
], ids=["twice-in-batch", "twice-across-batches", "twice-across-files", "null-part", "outside-range"])
def test_no_proof_when_some_key_may_repeat_or_cannot_be_placed(tmp_path, tables):
    paths = parquet_parts(tmp_path, *tables)
    assert not keys_unique_in_range(paths, ["k", "n"], [(1, 9), (1, 7)], batch_rows=2)
    assert not keys_unique_in_range(paths, ["k", "n"], [(1, 9), (1, 7)], batch_rows=4)


def test_ranges_beyond_the_bitmap_limit_and_other_types_give_no_proof(tmp_path, monkeypatch):
    paths = parquet_parts(tmp_path, {"k": [1, 2], "s": ["a", "b"]})
    assert fits([(1, 2)]) and not fits([(0, sizes().key_bitmap_bits)])
    set_sizes(monkeypatch, key_bitmap_bits=3)
    assert not keys_unique_in_range(paths, ["k"], [(1, 4)])
    assert keys_unique_in_range(paths, ["k"], [(1, 3)])
    assert not keys_unique_in_range(paths, ["s"], [(0, 1)])  # not an integer column
    assert not keys_unique_in_range(paths, ["missing"], [(0, 1)])
