"""Durable progress of a snapshot: its plan (epoch, chunks, totals) and the chunks done.

Stored in `<target>/_airflow_backfill/snapshot.json` and replaced atomically, so a crash
leaves either the old or the new record, never half of one. The plan is saved before the
first chunk runs. Which chunks are committed is decided by the Delta log (each chunk is
one idempotent append); this file adds what the log does not say directly (rows read,
seconds, parallelism per chunk) for the logs, `status` and the final commit's metadata.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field, fields

from airflow_backfill.engine.job_state import state_dir

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


@dataclass
class SnapshotProgress:
    epoch: int
    chunks_total: int
    rows_total: int
    files_total: int
    done: dict[int, DoneChunk] = field(default_factory=dict)

    @property
    def rows_done(self) -> int:
        return sum(chunk.rows_in for chunk in self.done.values())



def load_progress(target: str) -> SnapshotProgress | None:
    try:
        with open(os.path.join(state_dir(target), PROGRESS_FILE)) as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return None
    known = {f.name for f in fields(DoneChunk)}  # records of older versions may carry more
    done = {int(k): DoneChunk(**{n: v for n, v in chunk.items() if n in known}) for k, chunk in data.pop("done").items()}
    return SnapshotProgress(**data, done=done)


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
