"""Commits made by delta-rs, as a Python service of a user's would make them.

Appends and re-inserts with `write_deltalake`, in-place updates with `DeltaTable.update`,
deletes with `DeltaTable.delete` and upserts with `DeltaTable.merge` (matched rows
updated, the others inserted). delta-rs writes no deletion vectors: an update, delete
or merge rewrites every file it touches and, with the Change Data Feed on, writes change
files of the rows it changed.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, write_deltalake

from bench.commit_mix import APPEND, DELETE, REINSERT, UPDATE, UPSERT, CommitPlan

if TYPE_CHECKING:
    from bench.user_tables import UserTable

UPSTREAM_PROPERTIES = {"delta.enableChangeDataFeed": "true", "delta.checkpointInterval": "10"}
ROWS_PER_FILE = 1_000_000
BYTES_PER_FILE = 128 * 1024 * 1024
_SAMPLE_ROWS = 50_000


def file_size_for(rows: pa.Table) -> int:
    """The target file size that writes about `ROWS_PER_FILE` rows a file, at most
    `BYTES_PER_FILE`: what a table's initial load looks like, measured on a sample."""
    sample = rows.slice(0, _SAMPLE_ROWS)
    buffer = io.BytesIO()
    pq.write_table(sample, buffer, compression="snappy")
    per_row = buffer.tell() / max(1, sample.num_rows)
    return int(min(BYTES_PER_FILE, max(1024 * 1024, per_row * ROWS_PER_FILE)))


def create(uri: str, rows: pa.Table, metadata: dict[str, str]) -> None:
    """The table's initial load: version 0, in files of about a million rows."""
    write_deltalake(uri, rows, mode="error", configuration=UPSTREAM_PROPERTIES, target_file_size=file_size_for(rows),
                    commit_properties=CommitProperties(custom_metadata=metadata))


def commit(table: UserTable, uri: str, plan: CommitPlan, rows: pa.Table, metadata: dict[str, str]) -> None:
    """One commit of `plan`; `rows` are the new images of its inserted and updated keys
    (an upsert's), or of its inserted keys. Raises `CommitFailedError` on a conflict."""
    properties = CommitProperties(custom_metadata=metadata)
    if plan.kind in (APPEND, REINSERT):
        write_deltalake(uri, rows, mode="append", commit_properties=properties)
    elif plan.kind == UPDATE:
        DeltaTable(uri).update(updates=table.updates, predicate=table.predicate(plan.updated),
                               commit_properties=properties)
    elif plan.kind == DELETE:
        DeltaTable(uri).delete(predicate=table.predicate(plan.deleted), commit_properties=properties)
    elif plan.kind == UPSERT:
        matched = " AND ".join(f"t.{column} = s.{column}" for column in table.key)
        (DeltaTable(uri).merge(rows, predicate=matched, source_alias="s", target_alias="t",
                               commit_properties=properties)
         .when_matched_update_all().when_not_matched_insert_all().execute())
    else:
        raise ValueError(f"unknown commit kind {plan.kind!r}")
