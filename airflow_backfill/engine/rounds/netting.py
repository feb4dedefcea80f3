"""A change feed the driver holds, netted per upstream key with Arrow: what `net_changes`
computes with Spark's window functions, for a feed small enough to hold.

Why a second implementation: over a feed of a few thousand rows, Spark's netting plans two
window operators and runs a job (most of a one-row round's second). Netting is a sort by
key, newest commit first, and a pass over each key's rows; Arrow and numpy do it on the
values as they are, so nothing is converted to Python objects and no time zone is applied.
`tests/test_netting_properties.py` holds it to a plain reference over generated feeds,
and the differential harness to Spark's `net_changes` through whole rounds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_backfill.engine.delta.change_feed import (
    ARRIVING,
    CHANGE_TYPE,
    COMMIT_VERSION,
    FEED_COLUMNS,
    LEAVING,
)
from airflow_backfill.engine.delta.commits import ARRIVED
from airflow_backfill.engine.rounds.changes import BEFORE, CHANGE_RANK, DELETED, HELD_BEFORE


@dataclass(frozen=True)
class RepeatedKey:
    """A key the feed shows held twice at some epoch, with its values as Spark prints them."""

    values: dict[str, str]

    def describe(self) -> str:
        return ", ".join(f"{column}={value}" for column, value in self.values.items())


def net_feed(feed: pa.Table, key: Sequence[str], *, refuse_repeated_keys: bool) -> pa.Table | RepeatedKey:
    """Per key of `feed` (upstream columns, `_change_type`, `_commit_version`): its latest
    image, with `__deleted` (the latest change takes the row out), `__arrived` (the key's
    rows grew by one over the range), `__before` (a struct of the key's earliest change
    row) and `__held_before` (that row was a departure: the key had it before the range).

    The latest image is the newest commit's highest-ranked change (`CHANGE_RANK`), as
    Spark's netting orders them. With `refuse_repeated_keys`, a key whose row count,
    followed change by change, spans more than one returns `RepeatedKey` (a unique key is
    held 0 or 1 times at every epoch). NULL key values group together, as Spark's do."""
    upstream = [name for name in feed.column_names if name not in FEED_COLUMNS]
    if feed.num_rows == 0:
        return _netted(feed.select(upstream), feed.select(upstream), np.zeros(0, bool), np.zeros(0, bool),
                       np.zeros(0, bool))
    change = feed.column(CHANGE_TYPE)
    rank = pc.fill_null(pc.index_in(change, pa.array(list(CHANGE_RANK))), -1)
    order = pc.sort_indices(
        pa.table({**{f"k{i}": feed.column(name) for i, name in enumerate(key)},
                  "version": feed.column(COMMIT_VERSION), "rank": rank}),
        sort_keys=[*((f"k{i}", "ascending", "at_end") for i in range(len(key))), ("version", "descending", "at_end"),
                   ("rank", "descending", "at_end")])
    rows = feed.take(order)
    starts = _group_starts(rows, key)
    group = np.cumsum(starts) - 1
    first = np.flatnonzero(starts)
    last = np.append(first[1:] - 1, rows.num_rows - 1)
    arriving = pc.is_in(rows.column(CHANGE_TYPE), pa.array(ARRIVING)).to_numpy(zero_copy_only=False)
    leaving = pc.is_in(rows.column(CHANGE_TYPE), pa.array(LEAVING)).to_numpy(zero_copy_only=False)
    sign = arriving.astype(np.int64) - leaving.astype(np.int64)
    total = np.add.reduceat(sign, first)
    if refuse_repeated_keys:
        repeated = _repeated_group(sign, group, first, total)
        if repeated is not None:
            return RepeatedKey(_key_text(rows, key, int(first[repeated])))
    latest, earliest = rows.select(upstream).take(first), rows.select(upstream).take(last)
    return _netted(latest, earliest, leaving[first], total == 1, leaving[last])


def _netted(latest: pa.Table, earliest: pa.Table, deleted: np.ndarray, arrived: np.ndarray,
            held_before: np.ndarray) -> pa.Table:
    before = pa.StructArray.from_arrays([earliest.column(i).combine_chunks() for i in range(earliest.num_columns)],
                                        fields=list(earliest.schema)) if earliest.num_columns else None
    columns = {name: latest.column(name) for name in latest.column_names}
    columns[DELETED] = pa.array(deleted, pa.bool_())
    columns[ARRIVED] = pa.array(arrived, pa.bool_())
    if before is not None:
        columns[BEFORE] = before
    columns[HELD_BEFORE] = pa.array(held_before, pa.bool_())
    return pa.table(columns)


def _group_starts(rows: pa.Table, key: Sequence[str]) -> np.ndarray:
    """True at each row whose key differs from the previous row's (NULL equals NULL)."""
    starts = np.zeros(rows.num_rows, bool)
    starts[0] = True
    if rows.num_rows < 2:
        return starts
    for name in key:
        column = rows.column(name).combine_chunks()
        here, previous = column.slice(1), column.slice(0, rows.num_rows - 1)
        differs = pc.fill_null(pc.not_equal(here, previous), False).to_numpy(zero_copy_only=False)
        nulls_differ = pc.not_equal(pc.is_null(here), pc.is_null(previous)).to_numpy(zero_copy_only=False)
        starts[1:] |= differs | nulls_differ
    return starts


def _repeated_group(sign: np.ndarray, group: np.ndarray, first: np.ndarray, total: np.ndarray) -> int | None:
    """The first group whose row count, read newest first, spans more than one: the count
    before each row is the total minus the signs of that row and the rows after it (newer)."""
    running = np.cumsum(sign)
    offset = np.concatenate(([0], running[first[1:] - 1])) if len(first) > 1 else np.zeros(1, running.dtype)
    after = running - offset[group]
    before = total[group] - after
    high = np.maximum(np.maximum.reduceat(before, first), total)
    low = np.minimum(np.minimum.reduceat(before, first), total)
    spanned = np.flatnonzero(high - low > 1)
    return int(spanned[0]) if len(spanned) else None


def _key_text(rows: pa.Table, key: Sequence[str], index: int) -> dict[str, str]:
    """The key of row `index` as Spark casts it to text (NULL for a missing value)."""
    values = {}
    for name in key:
        scalar = rows.column(name)[index]
        if not scalar.is_valid:
            values[name] = "NULL"
            continue
        try:
            values[name] = pc.cast(scalar, pa.string()).as_py()
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            values[name] = str(scalar.as_py())
    return values
