"""Rows of a Parquet file picked by position are its rows at those positions, read from the
row groups that hold them only; every row but some positions, in batches, likewise."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_backfill.engine.delta.row_positions import (
    RowSelection,
    bytes_read,
    groups_holding,
    read_selected,
    selected_batches,
)


def test_a_few_positions_are_read_from_the_row_groups_that_hold_them(tmp_path):
    path = str(tmp_path / "f.parquet")
    table = pa.table({"k": pa.array(range(1000), pa.int64()), "s": [f"s{i}" if i % 3 else None for i in range(1000)]})
    pq.write_table(table, path, row_group_size=128)
    metadata = pq.read_metadata(path)
    positions = np.array([130, 131, 200, 900], np.uint64)
    selection = RowSelection.at(positions)
    assert groups_holding(metadata, selection) == [1, 7]
    assert bytes_read(metadata, [1, 7]) < bytes_read(metadata, range(metadata.num_row_groups))
    assert read_selected(path, ["s", "k"], selection) == table.select(["s", "k"]).take(positions.astype(np.int64))
    everything_but = RowSelection.all_but(np.array([5, *range(128, 256), 999], np.uint64))
    assert groups_holding(metadata, everything_but) == [0, *range(2, 8)]  # group 1 has no row left
    kept = [i for i in range(1000) if not 128 <= i < 256 and i not in (5, 999)]
    batches = list(selected_batches(path, ["k"], everything_but, batch_rows=50))
    assert pa.Table.from_batches(batches).column("k").to_pylist() == kept
    assert read_selected(path, ["k"], None).column("k").to_pylist() == list(range(1000))
    assert groups_holding(metadata, RowSelection.at(np.array([1000], np.uint64))) is None  # not this file's
    with pytest.raises(ValueError, match="fewer than its selection"):
        read_selected(path, ["k"], RowSelection.at(np.array([5, 1000], np.uint64)))
