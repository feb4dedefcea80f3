"""Rows of a Parquet data file picked by their positions, reading only the row groups that
hold them.

Why: a deletion vector names rows by their position in their data file (the physical row
index, counted across row groups in file order), and a DELETE of a few rows of a large
file marks a few positions. Reading the whole file's columns to take them costs what the
file weighs; its footer says how many rows each row group holds, so only the groups that
hold a position are read, and the positions taken from them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from airflow_backfill.storage import files

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

_BUFFER_BYTES = 1 << 20
"""Read buffer of a file read in batches: no whole column chunk held at once."""


@dataclass(frozen=True)
class RowSelection:
    """Which rows of a data file: the ones at `positions`, or every row but them (`inverted`)."""

    positions: np.ndarray
    """Row positions in the file, sorted and distinct (unsigned 64-bit, as vectors hold them)."""
    inverted: bool = False

    @classmethod
    def at(cls, positions: np.ndarray) -> RowSelection:
        return cls(np.asarray(positions, np.uint64))

    @classmethod
    def all_but(cls, positions: np.ndarray) -> RowSelection:
        return cls(np.asarray(positions, np.uint64), inverted=True)

    def rows(self, file_rows: int) -> int:
        """Rows selected in a file of `file_rows` rows."""
        return file_rows - len(self.positions) if self.inverted else len(self.positions)


def _group_starts(metadata: pq.FileMetaData) -> np.ndarray:
    """The position of each row group's first row, and the file's row count last."""
    counts = [metadata.row_group(group).num_rows for group in range(metadata.num_row_groups)]
    return np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.uint64)


def groups_holding(metadata: pq.FileMetaData, selection: RowSelection) -> list[int] | None:
    """The row groups that hold a selected row (every group with a row left, for an
    inverted selection); None when a position lies beyond the file's rows (the selection
    is not this file's)."""
    starts = _group_starts(metadata)
    positions = selection.positions
    if len(positions) and positions[-1] >= starts[-1]:
        return None
    if selection.inverted:
        marked = np.diff(np.searchsorted(positions, starts))
        return [group for group in range(metadata.num_row_groups) if marked[group] < starts[group + 1] - starts[group]]
    return [int(group) for group in np.unique(np.searchsorted(starts, positions, side="right") - 1)]


def bytes_read(metadata: pq.FileMetaData, groups: Sequence[int]) -> int:
    """The compressed bytes of `groups`' column chunks: what reading them fetches at most."""
    return sum(metadata.row_group(group).column(column).total_compressed_size
               for group in groups for column in range(metadata.num_columns))


def selected_batches(uri: str, columns: list[str], selection: RowSelection | None, *, batch_rows: int | None = None,
                     dictionary: Sequence[str] = ()) -> Iterator[pa.RecordBatch]:
    """The selected rows (every row when `selection` is None) in file order: those of
    `columns` the file has, read row group by row group from the groups that hold them
    only, `batch_rows` rows at a time (a whole group when None); `dictionary`: columns
    of the file read dictionary-encoded."""
    import pyarrow as pa

    options: dict[str, Any] = {"read_dictionary": list(dictionary)}
    if batch_rows:
        options["buffer_size"] = _BUFFER_BYTES
    with files.parquet_file(uri, **options) as parquet:
        metadata = parquet.metadata
        groups = list(range(metadata.num_row_groups)) if selection is None else groups_holding(metadata, selection)
        if groups is None:
            raise ValueError(f"{uri} holds {metadata.num_rows} rows, fewer than its selection names")
        present = [column for column in columns if column in parquet.schema_arrow.names]
        starts = _group_starts(metadata)
        for group in groups:
            start = int(starts[group])
            size = batch_rows or max(1, int(starts[group + 1]) - start)
            for batch in parquet.iter_batches(batch_size=size, row_groups=[group], columns=present,
                                              use_threads=False):
                picked = None if selection is None else _picked(selection, start, batch.num_rows)
                start += batch.num_rows
                if picked is None:
                    yield batch
                elif len(picked):
                    yield batch.take(pa.array(picked))


def read_selected(uri: str, columns: list[str], selection: RowSelection | None) -> pa.Table:
    """The selected rows as one table (see `selected_batches`)."""
    import pyarrow as pa

    batches = list(selected_batches(uri, columns, selection))
    if batches:
        return pa.Table.from_batches(batches)
    schema = files.parquet_metadata(uri).schema.to_arrow_schema()
    return schema.empty_table().select([column for column in columns if column in schema.names])


def _picked(selection: RowSelection, start: int, rows: int) -> np.ndarray | None:
    """The indexes within a batch of `rows` rows from position `start` that the selection
    takes; None when it takes them all."""
    positions = selection.positions
    low, high = np.searchsorted(positions, np.array([start, start + rows], np.uint64))
    inside = (positions[low:high] - np.uint64(start)).astype(np.int64)
    if not selection.inverted:
        return inside
    if not len(inside):
        return None
    keep = np.ones(rows, bool)
    keep[inside] = False
    return np.flatnonzero(keep)
