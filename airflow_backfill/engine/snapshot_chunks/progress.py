"""Durable progress of a snapshot: its plan (epoch, chunks, totals) and the chunks done.

Stored in `<target>/_airflow_backfill/snapshot.json` and replaced atomically, so a crash
leaves either the old or the new record, never half of one. The plan is saved before the
first chunk runs. Which chunks are committed is decided by the Delta log (each chunk is
one idempotent append); this file adds what the log does not say directly (rows read,
seconds, parallelism per chunk) for the logs, `status` and the final commit's metadata.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from airflow_backfill.engine.job_state import state_dir
from airflow_backfill.engine.snapshot_chunks.plan import PATH_ORDER
from airflow_backfill.storage import files
from airflow_backfill.storage.uri import join

PROGRESS_FILE = "snapshot.json"


@dataclass(frozen=True)
class DoneChunk:
    index: int
    rows_in: int
    rows_out: int
    seconds: float
    parallelism: int
    run_id: str
    """The run that produced the chunk: a resumed run keeps the ids of earlier runs."""
    bytes_in: int | None = None
    """Input bytes of the chunk's upstream files (None in records written before it was kept)."""
    finished_at: float | None = field(default_factory=time.time)
    """Wall-clock time the chunk was recorded: rates and ETAs come from it, so they survive
    restarts (None in records written before it was kept)."""


@dataclass
class SnapshotProgress:
    epoch: int
    chunks_total: int
    rows_total: int
    files_total: int
    done: dict[int, DoneChunk] = field(default_factory=dict)
    bytes_total: int | None = None
    """Input bytes of all chunks (None in records written before it was kept)."""
    file_order: str = PATH_ORDER
    """How the plan ordered the upstream's files (`snapshot_chunks.file_order`); records
    older than this field were planned in path order. A plan in another order has other
    chunks, so it is never resumed."""
    key_proved: bool = False
    """The upstream's key was proved unique at `epoch` before the first chunk, so a resumed
    run does not read every key again. Records older than this field may hold chunks
    written before any proof: they are proved again."""
    epochs: dict[str, int] = field(default_factory=dict)
    """A join's pinned version of each upstream (`epoch` is their sum); empty for one upstream."""

    @property
    def rows_done(self) -> int:
        return sum(chunk.rows_in for chunk in self.done.values())

    @property
    def bytes_done(self) -> int | None:
        """Input bytes of the chunks done; None when an older record lacks a chunk's size."""
        sizes = [chunk.bytes_in for chunk in self.done.values()]
        if self.bytes_total is None or any(size is None for size in sizes):
            return None
        return sum(size for size in sizes if size is not None)


def load_progress(target: str) -> SnapshotProgress | None:
    text = files.read_text(join(state_dir(target), PROGRESS_FILE))
    if text is None:
        return None
    data = json.loads(text)
    done = {int(k): _done_chunk(v) for k, v in data.pop("done").items()}
    return SnapshotProgress(**data, done=done)


def _done_chunk(record: dict[str, Any]) -> DoneChunk:
    """A chunk record. Older records lack the size and time, which stay unknown (never
    "now"), and may carry fields this version no longer keeps."""
    known = {f.name for f in fields(DoneChunk)}
    return DoneChunk(**{"bytes_in": None, "finished_at": None, **{k: v for k, v in record.items() if k in known}})


def save_progress(target: str, progress: SnapshotProgress) -> None:
    data = asdict(progress)
    data["done"] = {str(k): asdict(v) for k, v in progress.done.items()}
    files.write_text(join(state_dir(target), PROGRESS_FILE), json.dumps(data, indent=1, sort_keys=True), durable=True)


def discard_progress(target: str) -> None:
    files.remove(join(state_dir(target), PROGRESS_FILE))
