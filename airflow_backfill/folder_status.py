"""A folder of jobs at a glance: each MV's phase, lag in epochs and seconds, last commit
and last error, one line per MV (`airflow-backfill status --jobs-in DIR`).

Read from each MV's Delta log and state file, as `airflow-backfill status --job` reads
one (`engine/status.py`); nothing starts Spark. The last error is the newer of the MV's
`backfill_error` (its snapshot or catch-up in a folder backfilled as one) and
`forward_error` (a shared forward round), and is cleared by the next success.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from typing import Any

from airflow_backfill.engine.status import job_status
from airflow_backfill.job_folder import load_job_folder
from airflow_backfill.kafka.config import KafkaPipeline


@dataclass(frozen=True)
class FolderRow:
    """One MV of the folder."""

    job: str
    target: str
    phase: str
    """snapshot, catch_up or forward, with `(creating)` until catch-up handed over; `not
    started`; `kafka` for a Kafka pipeline (`airflow-backfill kafka-status` tells more)."""
    watermark: int | None
    pending_epochs: int | None
    lag_seconds: float | None
    last_commit_at: float | None
    """Epoch seconds of the MV's latest commit."""
    last_error: str | None


def _last_error(state: dict[str, Any]) -> str | None:
    errors = [(state.get(f"{kind}_error_at") or 0, state.get(f"{kind}_error")) for kind in ("backfill", "forward")]
    newest = max((entry for entry in errors if entry[1]), default=None, key=lambda entry: entry[0])
    return None if newest is None else str(newest[1])


def folder_rows(folder: str | os.PathLike[str]) -> tuple[list[FolderRow], dict[str, str]]:
    """Each MV's row, and the job files that failed to load (path: error)."""
    loaded = load_job_folder(folder)
    rows = []
    for entry in loaded.jobs:
        if isinstance(entry.job, KafkaPipeline):
            rows.append(FolderRow(entry.name, entry.target, "kafka", None, None, None, None, None))
            continue
        status = job_status(entry.job)
        phase = status.phase or "not started"
        if status.phase and status.state != "created":
            phase = f"{status.phase} (creating)"
        commit = status.commits[0].get("timestamp") if status.commits else None
        rows.append(FolderRow(entry.name, entry.target, phase, status.watermark, status.pending_epochs,
                              status.lag_seconds, None if commit is None else commit / 1000.0,
                              _last_error(status.progress)))
    return rows, {error.path: error.message for error in loaded.errors}


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def format_folder(rows: list[FolderRow], errors: dict[str, str], *, now: float | None = None) -> str:
    """A table, one MV a line, then the load errors."""
    now = time.time() if now is None else now
    header = ("job", "phase", "watermark", "lag epochs", "lag s", "last commit", "last error")
    table = [header]
    for row in rows:
        ago = None if row.last_commit_at is None else f"{max(0.0, now - row.last_commit_at):.0f}s ago"
        table.append((row.job, row.phase, _cell(row.watermark), _cell(row.pending_epochs), _cell(row.lag_seconds),
                      _cell(ago), " ".join((row.last_error or "-").split())[:200]))
    widths = [max(len(line[index]) for line in table) for index in range(len(header) - 1)]
    lines = ["  ".join([*(cell.ljust(width) for cell, width in zip(line, widths, strict=False)), line[-1]])
             for line in table]
    lines += [f"job file {path} failed to load: {message}" for path, message in sorted(errors.items())]
    return "\n".join(lines)


def as_json(rows: list[FolderRow], errors: dict[str, str]) -> dict[str, Any]:
    return {"mvs": [asdict(row) for row in rows], "load_errors": dict(sorted(errors.items()))}
