"""Freshness of every MV end to end: a base upstream's commit to the first MV commit reflecting it.

An MV commit reflects the versions its watermark names: its upstream's version (the app
transaction), a join's vector (`airflow_backfill.watermarks` in the commit's userMetadata,
one version per upstream), or, for an MV over an MV, a version of its source MV, which
reflects the base versions of the source's newest commit up to that version. Following
these links down to the upstreams no job writes gives each MV commit the base versions it
reflects; it reflects base commit U of table T when its version of T is at least U. Read
from the Delta logs' JSON entries alone (no table is loaded).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.measure import median, percentile

WATERMARKS_FIELD = "airflow_backfill.watermarks"
WORST_SHOWN = 5

LogCommits = Callable[[str], list[dict[str, Any]]]


def log_commits(uri: str) -> list[dict[str, Any]]:
    """(version, timestamp ms, app transactions, userMetadata) of every commit, in version
    order, read from the log's JSON files (cheaper than loading each version)."""
    commits = []
    for path in sorted((Path(uri) / "_delta_log").glob("*.json")):
        if not path.stem.isdigit():
            continue
        entry: dict[str, Any] = {"version": int(path.stem), "txn": {}, "timestamp": None, "metadata": {}}
        for line in path.read_text().splitlines():
            action = json.loads(line)
            if "txn" in action:
                entry["txn"][action["txn"]["appId"]] = int(action["txn"]["version"])
            if "commitInfo" in action:
                info = action["commitInfo"]
                entry["timestamp"] = info.get("timestamp")
                entry["metadata"] = _user_metadata(info.get("userMetadata"))
        commits.append(entry)
    return commits


def _user_metadata(text: str | None) -> dict[str, Any]:
    try:
        found = json.loads(text) if text else {}
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


@dataclass(frozen=True)
class Reflected:
    """One MV commit: its version, its time (s) and the base upstream versions it reflects."""

    version: int
    at: float
    bases: dict[str, int]


def reflected(jobs: Sequence[dict[str, Any]], commits_of: LogCommits = log_commits) -> dict[str, list[Reflected]]:
    """Per job, every commit that carries its watermark, with the base versions it reflects."""
    by_target = {job["target"]: job for job in jobs}
    found: dict[str, list[Reflected]] = {}

    def of(job: dict[str, Any]) -> list[Reflected]:
        if job["name"] not in found:
            found[job["name"]] = []  # a cycle (refused by the folder) reads as "nothing reflected"
            found[job["name"]] = _reflected_commits(job, commits_of(job["target"]), by_target, of)
        return found[job["name"]]

    return {job["name"]: of(job) for job in jobs}


def watermarked(job: dict[str, Any], commits: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, int]]]:
    """Each commit that carries the job's watermark, with the versions it read: `{"source":
    version}` (its app transaction), or a join's vector by alias (that of the newest
    commit up to it that carries one, as every reader takes it)."""
    app_id = f"airflow_backfill/{job['name']}"
    vector = None
    for commit in commits:
        text = commit["metadata"].get(WATERMARKS_FIELD)
        if text is not None:
            vector = json.loads(text) if isinstance(text, str) else text
        if app_id not in commit["txn"] or commit["timestamp"] is None:
            continue
        if "sources" not in job:
            yield commit, {"source": commit["txn"][app_id]}
        elif vector is not None:
            yield commit, {alias: int(version) for alias, version in vector.items()}


def tables_read(job: dict[str, Any], read: dict[str, int]) -> dict[str, int]:
    """`read` (by the names the query gives its tables) by table URI."""
    if "sources" not in job:
        return {job["source"]: read["source"]}
    return {source["table"]: read[alias] for alias, source in job["sources"].items()}


def _reflected_commits(job: dict[str, Any], commits: list[dict[str, Any]], by_target: dict[str, dict[str, Any]],
                       of: Callable[[dict[str, Any]], list[Reflected]]) -> list[Reflected]:
    out = []
    for commit, read in watermarked(job, commits):
        bases = _bases(tables_read(job, read), by_target, of)
        if bases is not None:
            out.append(Reflected(commit["version"], commit["timestamp"] / 1000.0, bases))
    return out


def _bases(read: dict[str, int], by_target: dict[str, dict[str, Any]],
           of: Callable[[dict[str, Any]], list[Reflected]]) -> dict[str, int] | None:
    """The base versions behind the tables and versions a commit read (None: a source MV
    had no watermark yet at that version). A base reached along two paths counts with the
    lower version: the commit reflects what both paths do."""
    bases: dict[str, int] = {}
    for table, version in read.items():
        source = by_target.get(table)
        through = {table: version} if source is None else as_of(of(source), version)
        if through is None:
            return None
        for base, base_version in through.items():
            bases[base] = min(base_version, bases.get(base, base_version))
    return bases


def as_of(commits: Sequence[Reflected], version: int) -> dict[str, int] | None:
    """The base versions an MV reflects at its version `version`: those of its newest
    commit up to it (`commits` in version order)."""
    best = None
    for commit in commits:
        if commit.version > version:
            break
        best = commit
    return None if best is None else best.bases


def lags(commits: Sequence[Reflected], base_times: dict[str, dict[int, float]], start: float, end: float,
         observed_until: float) -> tuple[list[float], int]:
    """Seconds from each base commit in [start, end) to the first MV commit reflecting it,
    and how many were not reflected by `observed_until` (counted with that lower bound)."""
    found, missed = [], 0
    for table in sorted({base for commit in commits for base in commit.bases}):
        mine = sorted((commit.at, commit.bases[table]) for commit in commits if table in commit.bases)
        for version, committed_at in base_times.get(table, {}).items():
            if not start <= committed_at < end:
                continue
            first = next((at for at, reflected_version in mine if reflected_version >= version), None)
            if first is None:
                missed += 1
                first = observed_until
            found.append(max(0.0, first - committed_at))
    return found, missed


def summary(values: Sequence[float]) -> dict[str, Any]:
    return {"median_s": round(median(values), 3), "p95_s": round(percentile(values, 0.95), 3),
            "max_s": round(max(values), 3), "samples": len(values)}


def freshness(jobs: Sequence[dict[str, Any]], kinds: dict[str, str], start: float, end: float, observed_until: float,
              commits_of: LogCommits = log_commits) -> dict[str, Any]:
    """Every MV's freshness against its base upstreams, over base commits in [start, end):
    median, p95 and max over all MVs and per kind, and the MVs with the worst medians. A
    commit no MV commit reflected by `observed_until` counts with its lower bound,
    `observed_until` minus its commit time (leaving it out would flatter the figures)."""
    by_job = reflected(jobs, commits_of)
    base_times: dict[str, dict[int, float]] = {}
    per_kind: dict[str, list[float]] = {}
    per_mv: dict[str, float] = {}
    missed = 0
    for job in jobs:
        for table in {base for commit in by_job[job["name"]] for base in commit.bases} - set(base_times):
            base_times[table] = {c["version"]: c["timestamp"] / 1000.0 for c in commits_of(table)
                                 if c["timestamp"] is not None}
        found, not_reflected = lags(by_job[job["name"]], base_times, start, end, observed_until)
        missed += not_reflected
        per_kind.setdefault(kinds[job["name"]], []).extend(found)
        if found:
            per_mv[job["name"]] = round(median(found), 3)
    every = [lag for found in per_kind.values() for lag in found]
    if not every:
        return {"status": "failed: no upstream commit in the window was reflected", "missed": missed}
    worst = sorted(per_mv.items(), key=lambda item: -item[1])[:WORST_SHOWN]
    return {**summary(every), "not_reflected_counted_as_lower_bound": missed,
            "kinds": {kind: summary(found) for kind, found in sorted(per_kind.items()) if found},
            "worst_mv_medians_s": dict(worst)}
