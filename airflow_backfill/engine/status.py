"""A job's status for people and scripts: phase, watermark, lag and progress.

Read from the Delta logs (the watermark, the upstream's latest epoch, every MV commit's
recorded parallelism) and the job's durable state files (chunk progress, catch-up
rounds, overrides); nothing here starts Spark, writes anything or depends on the memory
of a running phase, so the numbers survive retries and crashes. `airflow-backfill
status --json` and the Airflow UI page print the same `JobStatus.to_dict()`.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_backfill.engine import job_state
from airflow_backfill.engine.control import PAUSED_RATE_LIMIT, read_overrides
from airflow_backfill.engine.delta.log import (
    commit_history,
    commit_metadata,
    commit_timestamp,
    delta_table,
    last_commit_metadata,
    latest_version,
    read_watermark,
    table_exists,
)
from airflow_backfill.engine.feed_readers import recorded_feed_readers
from airflow_backfill.engine.joins.watermarks import committed_vector, latest_epoch
from airflow_backfill.engine.snapshot_chunks.progress import SnapshotProgress, load_progress

if TYPE_CHECKING:
    from airflow_backfill.job import BackfillJob

STATE_NOT_STARTED = "not started"
COMMITS_SHOWN = 100
"""The MV's latest commits listed with their parallelism (older ones stay in the Delta log)."""


@dataclass(frozen=True)
class SnapshotStatus:
    """How far an unfinished (or the last) snapshot got, as exact fractions of its input."""

    epoch: int
    chunks_done: int
    chunks_total: int
    rows_done: int
    rows_total: int
    bytes_done: int | None = None
    """Input bytes of the chunks done; None for progress recorded before sizes were kept."""
    bytes_total: int | None = None
    rows_per_second: float | None = None
    """Input rows per wall-clock second over the chunks of the latest run (pauses included)."""
    bytes_per_second: float | None = None
    eta_seconds: float | None = None
    """Remaining input rows at `rows_per_second`; None before a rate is known."""
    chunk_parallelism: list[int] = field(default_factory=list)
    """Backfill parallelism each finished chunk ran at, in chunk order."""


@dataclass(frozen=True)
class ControlStatus:
    """The backfill parallelism and rate limit the next chunk or round runs with."""

    backfill_parallelism: int
    rate_limit: int | None
    """Rows per second; None for no cap, 0 while paused."""
    job_backfill_parallelism: int
    job_rate_limit: int | None
    altered: bool
    paused: bool
    paused_since: float | None
    """When the running phase started holding (epoch seconds); None when it is not held."""


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
    lag_seconds: float | None
    """Commit time of the upstream's latest epoch minus that of the watermark epoch."""
    mv_version: int | None
    """The MV table's latest Delta version."""
    last_commit: dict[str, Any] = field(default_factory=dict)
    """The `airflow_backfill.*` metadata of the MV's latest commit, without the prefix."""
    progress: dict[str, Any] = field(default_factory=dict)
    """The job's state file (phase, rounds, rows, timings), as the phases recorded it."""
    snapshot: SnapshotStatus | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    """Backfill parallelism / rate limit set with `alter`, applied at the next round."""
    control: ControlStatus | None = None
    catch_up_rounds: list[dict[str, Any]] = field(default_factory=list)
    """One entry per catch-up round: pending epochs, seconds behind, parallelism, rate limit."""
    commits: list[dict[str, Any]] = field(default_factory=list)
    """The MV's latest commits, newest first: version, timestamp, phase, epoch, parallelism."""
    upstreams: list[dict[str, Any]] = field(default_factory=list)
    """Per upstream: name, table, latest version, the version the MV reflects, pending
    epochs and lag seconds. For a join the single numbers above are sums over these."""
    feed_readers: list[str] | None = None
    """The readers that read the MV's change feed exactly, as its table property records
    them (engine/feed_readers.py); None before the MV exists or when it predates the property."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def job_status(job: BackfillJob) -> JobStatus:
    """Collect the job's status from the Delta logs and the state files."""
    upstream_version = latest_epoch(job)
    watermark = read_watermark(job.target, job.app_id)
    mv_version = None
    if table_exists(job.target):
        mv_version = delta_table(job.target).version()
    upstreams = _upstream_lags(job, watermark)
    pending = lag_seconds = None
    if upstream_version is not None and watermark is not None:
        pending = max(0, upstream_version - watermark)
        seconds = [entry["lag_seconds"] for entry in upstreams]
        lag_seconds = None if None in seconds else max(seconds, default=0.0)
    progress = job_state.read_state(job.target)
    overrides = read_overrides(job.target)
    return JobStatus(
        job_name=job.name,
        source=job.source or ", ".join(upstream.table for upstream in job.upstreams),
        target=job.target,
        phase=progress.get("phase"),
        state=progress.get("state") or STATE_NOT_STARTED,
        watermark=watermark,
        upstream_version=upstream_version,
        pending_epochs=pending,
        lag_seconds=lag_seconds,
        mv_version=mv_version,
        last_commit=last_commit_metadata(job.target),
        progress=progress,
        snapshot=_snapshot_status(job.target),
        overrides=overrides,
        control=_control_status(job, overrides, progress),
        catch_up_rounds=list(progress.get("catch_up_rounds") or []),
        commits=mv_commits(job.target) if mv_version is not None else [],
        upstreams=upstreams,
        feed_readers=recorded_feed_readers(job.target) if mv_version is not None else None,
    )


def _upstream_lags(job: BackfillJob, watermark: int | None) -> list[dict[str, Any]]:
    """Each upstream's latest version, the version the MV reflects and the lag between."""
    applied: dict[str, int] | None = None
    if watermark is not None:
        applied = committed_vector(job) if job.is_join else {job.upstreams[0].name: watermark}
    entries = []
    for upstream in job.upstreams:
        latest = latest_version(upstream.table) if table_exists(upstream.table) else None
        version = None if applied is None else applied[upstream.name]
        entry: dict[str, Any] = {"name": upstream.name, "table": upstream.table, "upstream_version": latest,
                                 "watermark": version, "pending_epochs": None, "lag_seconds": None}
        if latest is not None and version is not None:
            entry.update(pending_epochs=max(0, latest - version),
                         lag_seconds=_lag_seconds(upstream.table, version, latest))
        entries.append(entry)
    return entries


def _lag_seconds(source: str, watermark: int, upstream_version: int) -> float | None:
    if upstream_version <= watermark:
        return 0.0
    newest, applied = commit_timestamp(source, upstream_version), commit_timestamp(source, watermark)
    if newest is None or applied is None:
        return None
    return max(0.0, (newest - applied) / 1000.0)


def _control_status(job: BackfillJob, overrides: dict[str, Any], progress: dict[str, Any]) -> ControlStatus:
    rate_limit = overrides.get("rate_limit", job.rate_limit)
    paused = rate_limit == PAUSED_RATE_LIMIT
    return ControlStatus(
        backfill_parallelism=overrides.get("backfill_parallelism", job.backfill_parallelism),
        rate_limit=rate_limit,
        job_backfill_parallelism=job.backfill_parallelism,
        job_rate_limit=job.rate_limit,
        altered=bool(overrides),
        paused=paused,
        paused_since=progress.get("paused_since") if paused else None,
    )


def mv_commits(target: str, limit: int = COMMITS_SHOWN) -> list[dict[str, Any]]:
    """The MV's latest commits with the parallelism each one recorded, newest first."""
    commits = []
    for entry in commit_history(target, limit=limit):
        metadata = commit_metadata(entry)
        if not metadata:
            continue
        commits.append({
            "version": entry.get("version"),
            "timestamp": entry.get("timestamp"),
            "phase": metadata.get("phase"),
            "epoch": _as_int(metadata.get("epoch")),
            "parallelism": _as_int(metadata.get("parallelism")),
            "rows": _as_int(metadata.get("rows")),
            "chunk_parallelism": _int_list(metadata.get("chunk_parallelism")),
            "chunk": _as_int(metadata.get("chunk")),
            "plan": _plan(metadata.get("plan")),
        })
    return commits


def _plan(value: Any) -> dict[str, Any] | None:
    """A round's recorded plan (`airflow_backfill.plan`: JSON), None for other commits."""
    if not isinstance(value, str):
        return None
    try:
        parsed = json.loads(value)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _as_int(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def _int_list(value: Any) -> list[int]:
    """`chunk_parallelism` is recorded as "2,2,1"."""
    if not isinstance(value, str) or not value:
        return []
    return [int(part) for part in value.split(",") if part.strip().isdigit()]


def _snapshot_status(target: str) -> SnapshotStatus | None:
    progress = load_progress(target)
    if progress is None:
        return None
    rows_rate, bytes_rate = snapshot_rates(progress)
    remaining = progress.rows_total - progress.rows_done
    eta = None
    if remaining <= 0:
        eta = 0.0
    elif rows_rate:
        eta = round(remaining / rows_rate, 1)
    return SnapshotStatus(
        epoch=progress.epoch,
        chunks_done=len(progress.done),
        chunks_total=progress.chunks_total,
        rows_done=progress.rows_done,
        rows_total=progress.rows_total,
        bytes_done=progress.bytes_done,
        bytes_total=progress.bytes_total,
        rows_per_second=rows_rate,
        bytes_per_second=bytes_rate,
        eta_seconds=eta,
        chunk_parallelism=[progress.done[index].parallelism for index in sorted(progress.done)],
    )


def snapshot_rates(progress: SnapshotProgress) -> tuple[float | None, float | None]:
    """(rows/s, bytes/s) over the latest run's chunks, from their recorded finish times.

    The span runs from the start of the run's first chunk to the end of its last, so
    pauses for the rate limit count; chunks of earlier runs are left out, since the time
    between runs (a crash, a retry) is not the snapshot's speed.
    """
    timed = [chunk for chunk in progress.done.values() if chunk.finished_at is not None]
    if not timed:
        return None, None
    latest_run = max(timed, key=lambda chunk: chunk.finished_at or 0.0).run_id
    run = [chunk for chunk in timed if chunk.run_id == latest_run]
    begin = min((chunk.finished_at or 0.0) - chunk.seconds for chunk in run)
    span = max(chunk.finished_at or 0.0 for chunk in run) - begin
    if span <= 0:
        return None, None
    rows_rate = round(sum(chunk.rows_in for chunk in run) / span, 1)
    sizes = [chunk.bytes_in for chunk in run]
    bytes_rate = None if any(size is None for size in sizes) else round(sum(s or 0 for s in sizes) / span, 1)
    return rows_rate, bytes_rate


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
        f"lag seconds     {_or_dash(status.lag_seconds)}",
    ]
    if len(status.upstreams) > 1:
        for entry in status.upstreams:
            lines.append(
                f"upstream        {entry['name']}: version {_or_dash(entry['upstream_version'])}, watermark "
                f"{_or_dash(entry['watermark'])}, pending {_or_dash(entry['pending_epochs'])}, lag seconds "
                f"{_or_dash(entry['lag_seconds'])}"
            )
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
        if snap.bytes_done is not None and snap.bytes_total is not None:
            lines.append(f"                {snap.bytes_done}/{snap.bytes_total} input bytes")
        if snap.rows_per_second is not None:
            lines.append(f"                {snap.rows_per_second:.0f} rows/s, ETA {_or_dash(snap.eta_seconds)}s")
    lines.extend(_progress_lines(status.progress))
    if status.last_commit:
        commit = status.last_commit
        lines.append(
            f"last commit     MV version {_or_dash(status.mv_version)}, phase {commit.get('phase', '-')}, "
            f"epoch {commit.get('epoch', '-')}, parallelism {commit.get('parallelism', '-')}, "
            f"rows {commit.get('rows', '-')}" + _plan_text(commit.get("plan"))
        )
    if status.feed_readers is not None:
        lines.append(f"feed readers    {', '.join(status.feed_readers)} (read the MV's change feed exactly)")
    if status.control is not None and status.control.paused:
        lines.append("paused          rate limit 0: the backfill holds at its next chunk or round")
    if status.overrides:
        altered = ", ".join(f"{key}={value}" for key, value in sorted(status.overrides.items()))
        lines.append(f"altered         {altered} (applies from the next round)")
    updated_at = status.progress.get("updated_at")
    if isinstance(updated_at, int | float):
        age = (time.time() if now is None else now) - updated_at
        lines.append(f"state updated   {max(age, 0):.0f}s ago")
    return "\n".join(lines)


def _plan_text(recorded: Any) -> str:
    """", plan replace (cheapest estimate 1.20 s, ...)" for a commit that recorded its plan."""
    plan = _plan(recorded) if isinstance(recorded, str) else recorded
    if not isinstance(plan, dict) or "plan" not in plan:
        return ""
    return f", plan {plan['plan']} ({plan.get('reason', '')})"


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
            + (f", plan {last['plan']}" if last.get("plan") else "")
        )
    if "caught_up_epoch" in progress:
        converged = "" if progress.get("catch_up_converged", True) else " (lag stalled; handed over)"
        lines.append(f"caught up at    epoch {progress['caught_up_epoch']}{converged}")
    if "forward_commits" in progress:
        lines.append(f"forward         {progress['forward_commits']} commits")
    return lines
