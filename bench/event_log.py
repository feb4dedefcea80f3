"""Account for a stretch of Spark work job by job, from Spark's event log.

`python -m bench.event_log <event-log-file> [--since MS] [--until MS]` prints every Spark
job in the window: when it started (ms after the window's start), how long it ran, its
tasks, the SQL execution it belongs to and the call site or description that started it;
then the total time jobs ran and the time between them (driver work: planning, Delta's
log, Python). A round that takes seconds over a small change is usually many small jobs
and the gaps between them; this shows which. Each job is also given a cause, read from the
call stack that started it (Delta's own jobs carry Delta's frames), and the jobs are summed
per cause.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class SparkJob:
    """One Spark job as the event log records it."""

    job_id: int
    start_ms: int
    end_ms: int = 0
    tasks: int = 0
    execution_id: int | None = None
    call_site: str = ""
    description: str = ""
    cause: str = ""

    @property
    def seconds(self) -> float:
        return max(0, self.end_ms - self.start_ms) / 1000.0


@dataclass
class SqlExecution:
    """One SQL execution (a query or a command) and the jobs it ran."""

    execution_id: int
    start_ms: int
    end_ms: int = 0
    description: str = ""
    jobs: list[int] = field(default_factory=list)


def read_events(path: Path) -> tuple[dict[int, SparkJob], dict[int, SqlExecution]]:
    """The jobs and SQL executions of an event log: a file, or the folder of a rolling log
    (Spark 4's default, `events_<n>_<app>` parts in order), plain or zstd-compressed."""
    jobs: dict[int, SparkJob] = {}
    executions: dict[int, SqlExecution] = {}
    parts = sorted(path.glob("events_*"), key=_part_number) if path.is_dir() else [path]
    for part in parts:
        for line in _lines(part):
            _record(json.loads(line), jobs, executions)
    return jobs, executions


def _part_number(part: Path) -> int:
    pieces = part.name.split("_")
    return int(pieces[1]) if len(pieces) > 1 and pieces[1].isdigit() else 0


def _lines(part: Path) -> list[str]:
    data = part.read_bytes()
    if part.suffix == ".zstd":
        import zstandard  # installed with pyspark-client, which the Spark provider requires

        data = zstandard.ZstdDecompressor().stream_reader(data).read()
    return [line for line in data.decode().splitlines() if line.strip()]


def _record(event: dict[str, Any], jobs: dict[int, SparkJob], executions: dict[int, SqlExecution]) -> None:
    kind = event.get("Event", "")
    if kind == "SparkListenerJobStart":
        properties = event.get("Properties") or {}
        execution = properties.get("spark.sql.execution.id")
        job = SparkJob(
            job_id=event["Job ID"], start_ms=event["Submission Time"],
            tasks=sum(stage.get("Number of Tasks", 0) for stage in event.get("Stage Infos", [])),
            execution_id=int(execution) if execution is not None else None,
            call_site=properties.get("callSite.short", ""),
            description=properties.get("spark.job.description", "") or "",
        )
        stages = event.get("Stage Infos", [])
        job.call_site = job.call_site or (stages[-1].get("Stage Name", "") if stages else "")
        job.cause = job_cause(job, "\n".join(stage.get("Details", "") for stage in stages))
        jobs[job.job_id] = job
        if job.execution_id in executions:
            executions[job.execution_id].jobs.append(job.job_id)
    elif kind == "SparkListenerJobEnd" and event["Job ID"] in jobs:
        jobs[event["Job ID"]].end_ms = event["Completion Time"]
    elif kind.endswith("SparkListenerSQLExecutionStart"):
        executions[event["executionId"]] = SqlExecution(
            execution_id=event["executionId"], start_ms=event["time"],
            description=(event.get("description") or "").splitlines()[0][:90] if event.get("description") else "",
        )
    elif kind.endswith("SparkListenerSQLExecutionEnd") and event["executionId"] in executions:
        executions[event["executionId"]].end_ms = event["time"]


_DELTA_CAUSES = (
    ("ScanWithDeletionVectors", "Delta: files with deletion vectors, looked up at each plan of a scan"),
    ("OptimisticTransactionImpl.filterFiles", "Delta: the transaction's files (an overwrite's or a DML's)"),
    ("Compute snapshot", "Delta: a new version's state rebuilt (its file list)"),
    ("Filtering files for query", "Delta: file skipping of a scan"),
    ("ClassicMergeExecutor", "Delta: MERGE"),
    ("DeleteCommand", "Delta: DELETE"),
    ("MergeIntoCommand", "Delta: MERGE"),
    ("WriteIntoDelta", "Delta: a write"),
    ("Checkpoints", "Delta: a checkpoint"),
)


def job_cause(job: SparkJob, details: str) -> str:
    """What started the job: Delta's own work (from its frames in the call stack), or the
    Python line of the engine that asked for a result."""
    text = f"{job.description}\n{details}"
    for marker, cause in _DELTA_CAUSES:
        if marker in text:
            return cause
    if " at /" in job.call_site and ".py:" in job.call_site:
        action, _, where = job.call_site.partition(" at ")
        return f"{action} at {'/'.join(where.split('/')[-3:])}"
    action = job.call_site.split(" at ")[0]
    if action.startswith("$anonfun$"):
        return "Spark: asynchronous work of a query (broadcasts, subqueries, Delta's prefetch)"
    return f"Spark: {action} of a DataFrame" if action else "other"


def causes(window: list[SparkJob]) -> str:
    """Jobs and their seconds summed per cause, the costliest first."""
    counts: Counter[str] = Counter(job.cause for job in window)
    seconds: defaultdict[str, float] = defaultdict(float)
    for job in window:
        seconds[job.cause] += job.seconds
    rows = [f"{'jobs':>5} {'job s':>7}  cause"]
    rows += [f"{counts[cause]:>5} {seconds[cause]:>7.3f}  {cause}"
             for cause in sorted(counts, key=lambda cause: -seconds[cause])]
    return "\n".join(rows)


def report(jobs: dict[int, SparkJob], executions: dict[int, SqlExecution], since: int, until: int) -> str:
    """A table of the jobs between `since` and `until` (epoch ms) and where the time went."""
    window = sorted((job for job in jobs.values() if since <= job.start_ms <= until), key=lambda j: j.start_ms)
    if not window:
        return "no Spark job in the window"
    origin = window[0].start_ms if since <= 0 else since
    rows = [f"{'start ms':>9} {'job s':>7} {'tasks':>5} {'sql':>4}  call site / description"]
    busy_until = origin
    busy = 0.0
    for job in window:
        overlap_start = max(job.start_ms, busy_until)
        if job.end_ms > overlap_start:
            busy += (job.end_ms - overlap_start) / 1000.0
            busy_until = job.end_ms
        execution = executions.get(job.execution_id) if job.execution_id is not None else None
        what = job.description or job.call_site
        if execution is not None and execution.description:
            what = f"{what}  [{execution.description}]"
        rows.append(f"{job.start_ms - origin:>9} {job.seconds:>7.3f} {job.tasks:>5} "
                    f"{'' if job.execution_id is None else job.execution_id:>4}  {what[:110]}  <{job.cause}>")
    end = max(job.end_ms for job in window)
    span = (end - origin) / 1000.0
    rows.append(f"{len(window)} jobs over {span:.3f} s: jobs running {busy:.3f} s, "
                f"no job running {span - busy:.3f} s (driver: planning, Delta's log, Python)")
    return "\n".join(rows) + "\n\n" + causes(window)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("event_log", type=Path,
                        help="a Spark event log: a file or a rolling log's folder in spark.eventLog.dir")
    parser.add_argument("--since", type=int, default=0, help="epoch ms: first job start to include")
    parser.add_argument("--until", type=int, default=2**62, help="epoch ms: last job start to include")
    args = parser.parse_args(argv)
    jobs, executions = read_events(args.event_log)
    print(report(jobs, executions, args.since, args.until))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
