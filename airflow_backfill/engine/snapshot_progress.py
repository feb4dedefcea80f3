"""Durable progress of a snapshot: which chunks are done and where their output is.

Stored in `<target>/_airflow_backfill/snapshot.json` and replaced atomically after each
chunk, so a crash leaves either the old or the new record, never half of one. Output
folders not listed as done belong to an attempt that crashed and are removed on resume.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_backfill.engine.job_state import state_dir

PROGRESS_FILE = "snapshot.json"


@dataclass(frozen=True)
class DoneChunk:
    index: int
    data_dir: str
    """Relative to the MV table root."""
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


def epoch_dir(target: str, epoch: int) -> str:
    """Where the snapshot at `epoch` writes its chunks' files (inside the MV table root)."""
    return os.path.join(target, "data", f"snapshot-e{epoch}")


def load_progress(target: str) -> SnapshotProgress | None:
    try:
        with open(os.path.join(state_dir(target), PROGRESS_FILE)) as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return None
    done = {int(k): _done_chunk(v) for k, v in data.pop("done").items()}
    return SnapshotProgress(**data, done=done)


def _done_chunk(record: dict[str, Any]) -> DoneChunk:
    """A chunk record; older records lack the size and time, which stay unknown (never "now")."""
    return DoneChunk(**{"bytes_in": None, "finished_at": None, **record})


def save_progress(target: str, progress: SnapshotProgress) -> None:
    data = asdict(progress)
    data["done"] = {str(k): asdict(v) for k, v in progress.done.items()}
    directory = state_dir(target)
    os.makedirs(directory, exist_ok=True)
    fd, tmp_path = tempfile.mkstemp(dir=directory, prefix=".snapshot-", suffix=".json")
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle, indent=1, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp_path, os.path.join(directory, PROGRESS_FILE))


def discard_progress(target: str) -> None:
    try:
        os.remove(os.path.join(state_dir(target), PROGRESS_FILE))
    except FileNotFoundError:
        pass


def remove_unrecorded_output(target: str, progress: SnapshotProgress | None) -> list[str]:
    """Delete chunk folders no progress record points to (output of crashed attempts)."""
    data_root = os.path.join(target, "data")
    if not os.path.isdir(data_root):
        return []
    keep = {os.path.normpath(os.path.join(target, c.data_dir)) for c in (progress.done.values() if progress else [])}
    removed: list[str] = []
    for epoch_name in os.listdir(data_root):
        epoch_path = os.path.join(data_root, epoch_name)
        if not epoch_name.startswith("snapshot-e") or not os.path.isdir(epoch_path):
            continue
        for chunk_name in os.listdir(epoch_path):
            chunk_path = os.path.normpath(os.path.join(epoch_path, chunk_name))
            if chunk_path not in keep:
                shutil.rmtree(chunk_path, ignore_errors=True)
                removed.append(chunk_path)
        if not os.listdir(epoch_path):
            os.rmdir(epoch_path)
    return removed
