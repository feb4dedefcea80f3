"""Exactness of the fifty MVs, checked by the tests' independent oracle (tests/oracle.py).

    python -m bench.exactness SPEC.json OUT.json

Every MV at its last watermark; and, for the MVs named in `every_version` (a sample of
each kind), every MV version committed in the window, each against the query evaluated
by DuckDB on what that version reflects: its upstream as of its watermark, a join's
upstreams as of its vector, an MV over an MV on its source MV as of the source version it
reflects. Run as its own process, with tests/ on the path, after the forward stopped.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.mv_freshness import log_commits, watermarked
from bench.mv_kinds import mv_key_and_aggregate

TESTS = Path(__file__).resolve().parents[1] / "tests"
FAILURES_KEPT = 3
"""Mismatches reported per MV (the first ones), each cut to a few hundred characters."""


def versions_to_check(job: dict[str, Any], start: float, end: float) -> list[tuple[int, dict[str, int]]]:
    """(MV version, the versions it read by the query's names for its tables) for each
    commit of the MV in [start, end] that carries its watermark."""
    return [(commit["version"], read) for commit, read in watermarked(job, log_commits(job["target"]))
            if start <= commit["timestamp"] / 1000.0 <= end]


def problems_at(job: dict[str, Any], mv_version: int | None, reflects: dict[str, int] | None) -> list[str]:
    """The oracle's diff of the MV at `mv_version` (latest: None) against the query on what
    it reflects (read from the MV when None)."""
    import oracle

    app_id = f"airflow_backfill/{job['name']}"
    key = None if "sources" in job else list(mv_key_and_aggregate(job)[0])
    if "sources" in job:
        if reflects is None:
            from deltalake import DeltaTable

            latest = DeltaTable(job["target"]).version()
            reflects = oracle.mv_vector(job["target"], app_id, latest)
        if reflects is None:
            return ["no watermark"]
        upstreams = {alias: source["table"] for alias, source in job["sources"].items()}
        expected = oracle.expected_join_rows(upstreams, reflects, job["query"])
    else:
        watermark = oracle.mv_watermark(job["target"], app_id, mv_version) if reflects is None else reflects["source"]
        if watermark is None:
            return ["no watermark"]
        expected = oracle.expected_rows(job["source"], watermark, job["query"])
    return oracle.diff_rows(expected, oracle.mv_rows(job["target"], mv_version), key=key)


def check(jobs: Sequence[dict[str, Any]], every_version: Sequence[str], start: float, end: float) -> dict[str, Any]:
    last: dict[str, Any] = {"checked": 0, "exact": 0, "failures": {}}
    for job in jobs:
        found = problems_at(job, None, None)
        last["checked"] += 1
        last["exact"] += not found
        if found:
            last["failures"][job["name"]] = "\n".join(found)[:300]
    versions: dict[str, Any] = {"mvs": list(every_version), "checked": 0, "exact": 0, "failures": {}}
    for job in (job for job in jobs if job["name"] in every_version):
        for mv_version, reflects in versions_to_check(job, start, end):
            found = problems_at(job, mv_version, reflects)
            versions["checked"] += 1
            versions["exact"] += not found
            kept = versions["failures"].setdefault(job["name"], []) if found else []
            if found and len(kept) < FAILURES_KEPT:
                kept.append(f"version {mv_version}: " + "\n".join(found)[:300])
    return {"last_watermark": last, "every_version": versions}


def main(argv: Sequence[str] | None = None) -> int:
    spec_path, out_path = (argv if argv is not None else sys.argv[1:])[:2]
    sys.path.insert(0, str(TESTS))
    spec = json.loads(Path(spec_path).read_text())
    result = check(spec["jobs"], spec.get("every_version", []), spec.get("start", 0.0), spec.get("end", 0.0))
    Path(out_path).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
