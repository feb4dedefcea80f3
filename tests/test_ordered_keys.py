"""The driver's proof of a unique key from files in key order: it proves what it should
(rows in a few runs of increasing keys whose spans lie apart), and it never proves a key
that some row holds twice (in one file, across a batch boundary or across files), nor
one it cannot compare exactly."""

from __future__ import annotations

import datetime
from decimal import Decimal

import pyarrow as pa
import pytest
from helpers_delta import parquet_parts
from size_overrides import set_sizes

from airflow_backfill.engine.delta.ordered_keys import keys_unique_in_order


def test_keys_in_order_within_and_across_files_are_proved(tmp_path):
    paths = parquet_parts(tmp_path, {"k": [1, 1, 2, 5], "n": [1, 2, 1, 1]}, {"k": [7, 8], "n": [3, 1]},
                   {"k": [], "n": []})
    assert keys_unique_in_order(paths, ["k", "n"], batch_rows=2)
    assert keys_unique_in_order(list(reversed(paths)), ["k", "n"], batch_rows=2)  # any file order


@pytest.mark.parametrize("tables", [
    ({"k": [1, 2, 2, 3], "n": [1, 1, 1, 1]},),  # a key twice inside a batch
    ({"k": [1, 2, 3, 3], "n": [5, 5, 5, 5]},),  # a key twice across a batch boundary (batches of 2 rows)
    ({"k": [1, 3, 2, 4], "n": [1, 1, 1, 1]},),  # runs that overlap: no proof, though unique
    ({"k": [1, 2], "n": [1, 1]}, {"k": [2, 3], "n": [1, 1]}),  # the same key in two files
    ({"k": [1, 5], "n": [1, 1]}, {"k": [3, 9], "n": [1, 1]}),  # spans that overlap
    ({"k": [5, 9], "n": [1, 1]}, {"k": [1, 2], "n": [1, 1]}, {"k": [8, 10], "n": [1, 1]}),  # overlap found late
    ({"k": [1, 1, 2, 3], "n": [None, None, 1, 1]},),  # a NULL key part: (1, NULL) twice, as Spark groups it
], ids=["twice-in-batch", "twice-across-batches", "out-of-order", "twice-across-files", "overlapping-spans",
        "overlap-after-sorting", "null-part"])
def test_no_proof_when_some_key_may_repeat(tmp_path, tables):
    assert not keys_unique_in_order(parquet_parts(tmp_path, *tables), ["k", "n"], batch_rows=2)
    assert not keys_unique_in_order(parquet_parts(tmp_path, *tables), ["k", "n"], batch_rows=4)


def test_strings_decimals_and_dates_compare_exactly(tmp_path):
    day = datetime.date(2020, 1, 1)
    unique = {"s": ["a", "b", "z", "é"], "d": pa.array([Decimal("-1.00"), Decimal("0.00"), Decimal("1.10"),
                                                         Decimal("1.20")], pa.decimal128(5, 2))}
    assert keys_unique_in_order(parquet_parts(tmp_path, unique), ["s"], batch_rows=3)  # "é" comes after "z"
    assert keys_unique_in_order(parquet_parts(tmp_path, unique), ["d"], batch_rows=3)
    assert not keys_unique_in_order(parquet_parts(tmp_path, {"d": unique["d"].take([1, 0, 2, 3])}), ["d"])
    assert keys_unique_in_order(parquet_parts(tmp_path, {"s": ["x", "x"], "t": [day, day + datetime.timedelta(days=1)]}),
                                ["s", "t"])
    assert not keys_unique_in_order(parquet_parts(tmp_path, {"s": ["x", "x"], "t": [day, day]}), ["s", "t"])
    assert keys_unique_in_order(parquet_parts(tmp_path, {"s": ["b", "c", "a"]}), ["s"])  # two runs: "b".."c", "a"
    assert not keys_unique_in_order(parquet_parts(tmp_path, {"s": ["b", "c", "a", "c"]}), ["s"])
    # by code point, in Arrow and in Python alike: the second file's span lies past "z"
    assert keys_unique_in_order(parquet_parts(tmp_path, {"s": ["é", "ê"]}, {"s": ["y", "z"]}), ["s"])
    assert not keys_unique_in_order(parquet_parts(tmp_path, {"s": ["é", "ê"]}, {"s": ["y", "é"]}), ["s"])


def test_files_in_several_sorted_runs_are_proved_up_to_the_limit_of_runs(tmp_path, monkeypatch):
    """Parts written one after the other into one file: runs of increasing keys, apart."""
    paths = parquet_parts(tmp_path, {"k": [20, 21, 22, 1, 2, 3, 10, 11]}, {"k": [30, 31, 25]}, {"k": [40, 41]})
    assert keys_unique_in_order(paths, ["k"], batch_rows=3)
    set_sizes(monkeypatch, key_runs=4)  # five runs: rows in no useful order
    assert not keys_unique_in_order(paths, ["k"], batch_rows=3)


def test_types_without_an_exact_order_and_unknown_columns_give_no_proof(tmp_path):
    assert not keys_unique_in_order(parquet_parts(tmp_path, {"f": [0.5, 1.5]}), ["f"])
    assert not keys_unique_in_order(parquet_parts(tmp_path, {"k": [1, 2]}), ["missing"])
    assert keys_unique_in_order([], ["k"])  # no file, no row: nothing is held twice
