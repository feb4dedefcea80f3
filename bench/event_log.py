"""Account for a stretch of Spark work job by job, from Spark's event log.

`python -m bench.event_log <event-log-file> [--since MS] [--until MS]` prints every Spark
job in the window: when it started (ms after the window's start), how long it ran, its
tasks, the SQL execution it belongs to and the call site or description that started it;
then the total time jobs ran and the time between them (driver work: planning, Delta's
log, Python). A round that takes seconds over a small change is usually many small jobs
and the gaps between them; this shows which.
"""

from __future__ import annotations

import argparse
import json
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
                    f"{'' if job.execution_id is None else job.execution_id:>4}  {what[:150]}")
    end = max(job.end_ms for job in window)
    span = (end - origin) / 1000.0
    rows.append(f"{len(window)} jobs over {span:.3f} s: jobs running {busy:.3f} s, "
                f"no job running {span - busy:.3f} s (driver: planning, Delta's log, Python)")
    return "\n".join(rows)


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
