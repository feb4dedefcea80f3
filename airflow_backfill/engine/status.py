"""A job's status for people and scripts: phase, watermark, lag and progress.

Read from the Delta logs (the watermark and the upstream's latest epoch) and the job's
state files; nothing here starts Spark or writes anything.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from deltalake import DeltaTable

from airflow_backfill.engine import job_state
from airflow_backfill.engine.control import read_overrides
from airflow_backfill.engine.delta.log import (
    last_commit_metadata,
    latest_version,
    read_watermark,
    table_exists,
)
from airflow_backfill.engine.phases.snapshot_progress import load_progress

if TYPE_CHECKING:
    from airflow_backfill.job import BackfillJob

STATE_NOT_STARTED = "not started"


@dataclass(frozen=True)
class SnapshotStatus:
    """How far an unfinished (or the last) snapshot got."""

    epoch: int
    chunks_done: int
    chunks_total: int
    rows_done: int
    rows_total: int


@dataclass(frozen=True)
class JobStatus:
    """Everything `airflow-backfill status` shows about one job."""

    job_name: str
    source: str
    target: str
    phase: str | None
    """snapshot, catch_up or forward; None before the first run."""
    state: str
    """creating (not yet caught up), created (consumers may read it) or not started."""
    watermark: int | None
    """The upstream epoch the MV reflects (its app transaction); None before the snapshot."""
    upstream_version: int | None
    """The upstream's latest epoch; None when the upstream does not exist yet."""
    pending_epochs: int | None
    """Upstream epochs the MV has not applied yet; None when either side is missing."""
    mv_version: int | None
    """The MV table's latest Delta version."""
    last_commit: dict[str, Any] = field(default_factory=dict)
    """The `airflow_backfill.*` metadata of the MV's latest commit, without the prefix."""
    progress: dict[str, Any] = field(default_factory=dict)
    """The job's state file (phase, rounds, rows, timings), as the phases recorded it."""
    snapshot: SnapshotStatus | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    """Backfill parallelism / rate limit set with `alter`, applied at the next round."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def job_status(job: BackfillJob) -> JobStatus:
    """Collect the job's status from the Delta logs and the state files."""
    upstream_version = latest_version(job.source) if table_exists(job.source) else None
    watermark = read_watermark(job.target, job.app_id)
    mv_version = None
    if table_exists(job.target):
        mv_version = DeltaTable(job.target).version()
    pending = None
    if upstream_version is not None and watermark is not None:
        pending = max(0, upstream_version - watermark)
    progress = job_state.read_state(job.target)
    return JobStatus(
        job_name=job.name,
        source=job.source,
        target=job.target,
        phase=progress.get("phase"),
        state=progress.get("state") or STATE_NOT_STARTED,
        watermark=watermark,
        upstream_version=upstream_version,
        pending_epochs=pending,
        mv_version=mv_version,
        last_commit=last_commit_metadata(job.target),
        progress=progress,
        snapshot=_snapshot_status(job.target),
        overrides=read_overrides(job.target),
    )


def _snapshot_status(target: str) -> SnapshotStatus | None:
    progress = load_progress(target)
    if progress is None:
        return None
    return SnapshotStatus(
        epoch=progress.epoch,
        chunks_done=len(progress.done),
        chunks_total=progress.chunks_total,
        rows_done=progress.rows_done,
        rows_total=progress.rows_total,
    )


def _or_dash(value: Any) -> str:
    return "-" if value is None else str(value)


def _percent(done: int, total: int) -> str:
    return "100%" if total <= 0 else f"{100 * done / total:.0f}%"


def format_status(status: JobStatus, *, now: float | None = None) -> str:
    """A multi-line, human-readable summary of `status`."""
    lines = [
        f"job             {status.job_name}",
        f"source          {status.source}",
        f"target (MV)     {status.target}",
        f"phase           {_or_dash(status.phase)}",
        f"state           {status.state}",
        f"watermark       {_or_dash(status.watermark)}",
        f"upstream epoch  {_or_dash(status.upstream_version)}",
        f"pending epochs  {_or_dash(status.pending_epochs)}",
    ]
    if status.upstream_version is None:
        lines.append("note            the upstream table does not exist yet")
    if status.watermark is None:
        lines.append("note            the MV has not been created: the snapshot phase has not committed")
    if status.snapshot is not None and status.watermark is None:
        snap = status.snapshot
        lines.append(
            f"snapshot        epoch {snap.epoch}: {snap.chunks_done}/{snap.chunks_total} chunks, "
            f"{snap.rows_done}/{snap.rows_total} rows ({_percent(snap.rows_done, snap.rows_total)})"
        )
    lines.extend(_progress_lines(status.progress))
    if status.last_commit:
        commit = status.last_commit
        lines.append(
            f"last commit     MV version {_or_dash(status.mv_version)}, phase {commit.get('phase', '-')}, "
            f"epoch {commit.get('epoch', '-')}, parallelism {commit.get('parallelism', '-')}, "
            f"rows {commit.get('rows', '-')}"
        )
    if status.overrides:
        altered = ", ".join(f"{key}={value}" for key, value in sorted(status.overrides.items()))
        lines.append(f"altered         {altered} (applies from the next round)")
    updated_at = status.progress.get("updated_at")
    if isinstance(updated_at, int | float):
        age = (time.time() if now is None else now) - updated_at
        lines.append(f"state updated   {max(age, 0):.0f}s ago")
    return "\n".join(lines)


def _progress_lines(progress: dict[str, Any]) -> list[str]:
    lines = []
    if "snapshot_epoch" in progress:
        lines.append(
            f"snapshot        {progress.get('snapshot_rows', '-')} rows at epoch {progress['snapshot_epoch']} "
            f"in {progress.get('snapshot_seconds', '-')}s"
        )
    rounds = progress.get("catch_up_rounds") or []
    if rounds:
        last = rounds[-1]
        lines.append(
            f"catch-up        {len(rounds)} rounds; last: {last.get('pending_epochs', '-')} pending epochs, "
            f"{last.get('change_rows', '-')} change rows in {last.get('seconds', '-')}s"
        )
    if "caught_up_epoch" in progress:
        converged = "" if progress.get("catch_up_converged", True) else " (lag stalled; handed over)"
        lines.append(f"caught up at    epoch {progress['caught_up_epoch']}{converged}")
    if "forward_commits" in progress:
        lines.append(f"forward         {progress['forward_commits']} commits")
    return lines
