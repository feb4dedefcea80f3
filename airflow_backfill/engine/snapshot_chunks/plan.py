"""Split the upstream's files at the pinned epoch into chunks the snapshot processes one by one.

Chunks are the snapshot's unit of progress: each finished chunk's output is durable, so
a rerun after a crash redoes only the chunk that was in flight. The split depends only on
the file list at the epoch, so a rerun computes the same chunks.

Files are taken in the order of their smallest key (from the log's statistics) when every
file has one, so that a chunk covers a contiguous key range. The chunks of an upstream
written in key order (ids that grow, tables clustered by key) then write MV files of
disjoint key ranges, which is what lets a round's key bounds skip files
(`delta/key_range.py`). File names (random ids) and commit order need not follow the keys.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from airflow_backfill.engine.delta.log import open_upstream
from airflow_backfill.storage.uri import join

KEY_ORDER = "key"
PATH_ORDER = "path"
"""How a chunk plan orders the files: by their smallest key, or by path when some file
has no statistics for the key."""

DEFAULT_CHUNK_BYTES = 256 * 1024 * 1024
"""Each chunk costs a Delta commit and a rebuild of the table's state before the next
append, about 1 s on two cores against about 2 s of work per 128 MiB of input; 256 MiB
halves that share, and a crash still redoes at most one chunk."""

DEFAULT_JOIN_CHUNK_BYTES = 1024 * 1024 * 1024
"""A join's chunk also reads and shuffles the other upstreams over its key range (and the
dimension tables whole), about 2 s a chunk at TPC-H SF 10 on two cores: Q3's snapshot took
29 s in 256 MiB chunks (seven), 22 s in 1 GiB chunks (three) and 16 s in one, against 15 s
for a plain Spark job (docs/benchmarks.md)."""


def default_chunk_bytes(is_join: bool) -> int:
    """The chunk size a snapshot uses when none is given."""
    return DEFAULT_JOIN_CHUNK_BYTES if is_join else DEFAULT_CHUNK_BYTES


@dataclass(frozen=True)
class DataFile:
    path: str
    size: int
    rows: int
    key_min: Any = None
    """The smallest value of the key's leading column, from the log's statistics (None
    when not asked for or not recorded)."""


@dataclass(frozen=True)
class Chunk:
    index: int
    files: tuple[DataFile, ...]

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


def list_data_files(uri: str, version: int, key_column: str | None = None, *,
                    actions: pa.Table | None = None) -> list[DataFile]:
    """A table's data files at `version`, in a stable order, with row counts; with
    `key_column`, ordered by each file's smallest value of it when every file records one
    (see `file_order`). `actions`: the version's add actions (flattened), when the caller
    read them already."""
    if actions is None:
        actions = pa.table(open_upstream(uri, version).get_add_actions(flatten=True))
    wanted = f"min.{key_column}".lower() if key_column is not None else None
    minimum = next((name for name in actions.column_names if name.lower() == wanted), None)
    minimums = actions.column(minimum).to_pylist() if minimum else [None] * actions.num_rows
    files = [
        DataFile(
            path=row["path"] if "://" in row["path"] or os.path.isabs(row["path"]) else join(uri, row["path"]),
            size=int(row["size_bytes"]),
            rows=int(row["num_records"] or 0),
            key_min=key_min,
        )
        for row, key_min in zip(actions.select(["path", "size_bytes", "num_records"]).to_pylist(), minimums,
                                strict=True)
    ]
    if file_order(files) == KEY_ORDER:
        return sorted(files, key=lambda f: (f.key_min, f.path))
    return sorted(files, key=lambda f: f.path)


def file_order(files: list[DataFile]) -> str:
    """`KEY_ORDER` when every file records its smallest key, else `PATH_ORDER`."""
    return KEY_ORDER if files and all(f.key_min is not None for f in files) else PATH_ORDER


def plan_chunks(files: list[DataFile], chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> list[Chunk]:
    """Consecutive groups of files of about `chunk_bytes` each (a big file is its own chunk)."""
    chunks: list[Chunk] = []
    current: list[DataFile] = []
    current_bytes = 0
    for file in files:
        if current and current_bytes + file.size > chunk_bytes:
            chunks.append(Chunk(len(chunks), tuple(current)))
            current, current_bytes = [], 0
        current.append(file)
        current_bytes += file.size
    if current:
        chunks.append(Chunk(len(chunks), tuple(current)))
    return chunks
