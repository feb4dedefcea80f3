"""The speed baseline beside the fifty MVs: a plain Spark recompute of one MV of each kind.

What a user would run instead of maintaining the MV: read its upstream (a join's
upstreams, an MV over an MV's source MV) as of the versions the MV last reflected, run its
query, overwrite a Delta table (`bench/plain_recompute.py`, its own `spark-submit`, as in
the `submit` section). Measured from outside (the process, as a task would run it) and
inside (read, query and write alone), in the same run as the rounds it is compared with.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.mv_freshness import log_commits, watermarked
from bench.submit import ROOT, spark_submit

PARALLELISM = 2


def last_reflected(job: dict[str, Any]) -> dict[str, tuple[str, int]] | None:
    """The tables the MV's query reads, by the names it gives them, each with the version
    the MV's last commit reflects."""
    last = None
    for _, read in watermarked(job, log_commits(job["target"])):
        last = read
    if last is None:
        return None
    if "sources" not in job:
        return {"source": (job["source"], last["source"])}
    return {alias: (source["table"], last[alias]) for alias, source in job["sources"].items()}


def recompute(job: dict[str, Any], work: Path) -> dict[str, Any]:
    tables = last_reflected(job)
    if tables is None:
        return {"mv": job["name"], "status": "failed: the MV has no watermark"}
    timing = work / f"plain_{job['name']}.json"
    arguments = ["--query", job["query"], "--target", str(work / "plain_recompute" / job["name"]),
                 "--timing-file", str(timing)]
    for name, (uri, version) in tables.items():
        arguments += ["--table", f"{name}={uri}@{version}"]
    try:
        wall = spark_submit(PARALLELISM, str(Path(ROOT) / "bench" / "plain_recompute.py"), *arguments)
    except (RuntimeError, OSError) as error:
        return {"mv": job["name"], "status": f"failed: {str(error)[-300:]}"}
    inside = json.loads(timing.read_text())["seconds"]
    return {"mv": job["name"], "versions": {name: version for name, (_, version) in tables.items()},
            "submit_s": wall, "read_query_write_s": inside}


def side_by_side(jobs: Sequence[dict[str, Any]], kinds: dict[str, str], work: Path) -> dict[str, Any]:
    """The first MV of each kind, recomputed plainly."""
    work.mkdir(parents=True, exist_ok=True)
    firsts: dict[str, dict[str, Any]] = {}
    for job in jobs:
        firsts.setdefault(kinds[job["name"]], job)
    return {kind: recompute(job, work) for kind, job in sorted(firsts.items())}
