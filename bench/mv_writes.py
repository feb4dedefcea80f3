"""What the MVs' rounds wrote, read from their Delta logs: rows written and whole-MV rewrites.

A round that changes a few rows should write a few rows. A round *rewrote the whole MV*
when its commit removed every file the MV held before it and re-added none of them (a
deletion-vector update removes and re-adds the same file: not a rewrite). Replayed from
the logs' JSON entries (add and remove actions, each add's `numRecords`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.measure import median, percentile


@dataclass(frozen=True)
class MvCommit:
    version: int
    at: float | None
    round: bool
    """Whether it carries the MV's watermark (a round; not maintenance)."""
    rows_written: int
    whole_rewrite: bool


def mv_commits(uri: str, app_id: str) -> Iterator[MvCommit]:
    active: set[str] = set()
    for path in sorted((Path(uri) / "_delta_log").glob("*.json")):
        if not path.stem.isdigit():
            continue
        added: dict[str, int] = {}
        removed: set[str] = set()
        at, is_round = None, False
        for line in path.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                stats = json.loads(action["add"].get("stats") or "{}")
                added[action["add"]["path"]] = int(stats.get("numRecords", 0))
            elif "remove" in action:
                removed.add(action["remove"]["path"])
            elif "txn" in action and action["txn"]["appId"] == app_id:
                is_round = True
            elif "commitInfo" in action:
                at = (action["commitInfo"].get("timestamp") or 0) / 1000.0 or None
        whole = bool(active) and active <= removed and not (active & set(added))
        rows = sum(count for file, count in added.items() if file not in removed)
        yield MvCommit(int(path.stem), at, is_round, rows, whole)
        active = (active - removed) | set(added)


def writes(jobs: Sequence[dict[str, Any]], kinds: dict[str, str], start: float, end: float) -> dict[str, Any]:
    """Per kind: rounds committed in [start, end], how many rewrote the whole MV, and the
    rows a round wrote (median, p90); the MVs rewritten whole most often."""
    per_kind: dict[str, dict[str, Any]] = {}
    whole_by_mv: dict[str, int] = {}
    for job in jobs:
        found = per_kind.setdefault(kinds[job["name"]], {"rounds": 0, "whole_mv_rewrites": 0, "rows": []})
        for commit in mv_commits(job["target"], f"airflow_backfill/{job['name']}"):
            if not commit.round or commit.at is None or not start <= commit.at <= end:
                continue
            found["rounds"] += 1
            found["rows"].append(commit.rows_written)
            if commit.whole_rewrite:
                found["whole_mv_rewrites"] += 1
                whole_by_mv[job["name"]] = whole_by_mv.get(job["name"], 0) + 1
    out = {}
    for kind, found in sorted(per_kind.items()):
        rows = found.pop("rows")
        out[kind] = {**found, "rows_written_median": median(rows) if rows else None,
                     "rows_written_p90": percentile(rows, 0.9) if rows else None}
    most = sorted(whole_by_mv.items(), key=lambda item: -item[1])[:5]
    return {"kinds": out, "whole_mv_rewrites": sum(found["whole_mv_rewrites"] for found in out.values()),
            "rounds": sum(found["rounds"] for found in out.values()), "most_rewritten": dict(most)}
