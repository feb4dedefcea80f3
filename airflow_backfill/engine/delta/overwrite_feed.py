"""The change feed of an overwrite the driver writes: what its keyed changes did, as rows.

Why: a small table (a stateless MV of a few thousand rows, an aggregate's MV) is
overwritten whole each round from rows the driver holds (`driver_file`). Without change
files, a change-feed reader derives such a commit's feed from its files: every old row
deleted, every new row inserted. An MV over it then reads and folds the whole table each
round where a few keys changed (measured on the `many_mvs` mix: an aggregate over a
20,000-row stateless MV took 1.33 s a round, against 0.40 s over an upstream). A commit
that holds change files is read from them alone (Delta's protocol), so the overwrite
also writes the rows its changes replaced and the rows they brought: the feed Delta's
own MERGE writes for the same changes.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from airflow_backfill.engine.delta.change_feed import CHANGE_TYPE
from airflow_backfill.engine.delta.key_lookup import contains


def overwrite_change_rows(leaving: pa.Table, arriving: pa.Table, key: Sequence[str]) -> pa.Table:
    """The change rows of replacing `leaving` (the table's rows of the changed keys) by
    `arriving` (their new rows), both in the table's columns and unique by `key`: a key in
    both is an update (its pre-image and post-image), a key only in `leaving` a delete, a
    key only in `arriving` an insert. Keys compare as Spark's `<=>` (NULL equals NULL)."""
    updated_before = contains(leaving, key, arriving, key)
    updated_after = contains(arriving, key, leaving, key)
    before = pc.if_else(updated_before, pa.scalar("update_preimage"), pa.scalar("delete"))
    after = pc.if_else(updated_after, pa.scalar("update_postimage"), pa.scalar("insert"))
    return pa.concat_tables([leaving.append_column(CHANGE_TYPE, before),
                             arriving.append_column(CHANGE_TYPE, after)])
