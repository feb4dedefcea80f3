"""Where a benchmark run's JSON goes, and what it says about the run.

Every benchmark command (`bench/run.py`, `bench/joins.py`, `bench/kafka_backfill.py`,
`bench/object_store.py`) writes one JSON file per run into `bench/results/`, named by
the run's date and the commit it measured, with a `meta` block that says how to make it
again: the command, the commit (and whether the tree had uncommitted changes), the date,
the machine and its load. `bench/table.py` builds docs/benchmarks.md's table from those
files, so a figure in the table is always one of them.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "bench" / "results"
"""The committed results, one JSON file per run."""
PACKAGES = ("pyspark", "delta-spark", "deltalake", "tpchgen-cli", "apache-airflow")


def git(*args: str) -> str:
    """A git command's output in the checkout, or "" outside a git checkout."""
    try:
        completed = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return completed.stdout.strip() if completed.returncode == 0 else ""


def commit() -> tuple[str, bool]:
    """The checkout's commit (short hash, "unknown" outside git) and whether files other than
    `bench/results/` differ from it: such a run measured code no commit holds."""
    head = git("rev-parse", "--short=7", "HEAD") or "unknown"
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)bench/results")
    return head, bool(changed)


def command_line(script: str, argv: Sequence[str]) -> str:
    """The command as a reader reruns it from the checkout: `python bench/run.py --scale 10`."""
    return " ".join(["python", f"bench/{script}", *(shlex.quote(arg) for arg in argv)])


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in PACKAGES:
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "not installed"
    return found


def machine() -> dict[str, Any]:
    try:
        import psutil

        memory_gib: float | None = round(psutil.virtual_memory().total / 1024**3, 1)
    except ImportError:
        memory_gib = None
    return {"cpus": os.cpu_count(), "memory_gib": memory_gib, "platform": platform.platform(),
            "python": platform.python_version()}


def rows_label(rows: int) -> str:
    """20000 -> "20k", 2000000 -> "2m": a size as file names say it."""
    for unit, size in (("m", 1_000_000), ("k", 1_000)):
        if rows >= size and rows % size == 0:
            return f"{rows // size}{unit}"
    return str(rows)


def run_meta(bench: str, script: str, argv: Sequence[str], label: str | None = None) -> dict[str, Any]:
    """The `meta` block of a run that starts now: call it before measuring (the load before).
    `label` names the run's file instead of `bench` (a section and its settings)."""
    head, dirty = commit()
    return {
        "bench": bench, **({"label": label} if label else {}), "command": command_line(script, argv),
        "commit": head, "dirty": dirty,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "date": time.strftime("%Y-%m-%d"),
        "load_before": load_average(), **machine(), "versions": versions(),
    }


def finish_meta(meta: dict[str, Any], seconds: float) -> dict[str, Any]:
    """The `meta` block once the run ended: its wall time and the load after."""
    return {**meta, "seconds": round(seconds, 1), "load_after": load_average()}


def result_path(meta: dict[str, Any], directory: Path = RESULTS_DIR) -> Path:
    """`bench/results/<date>-<HHMM>-<commit>-<label or bench>.json`: sorted by name, the runs
    are in the order they started."""
    stamp = time.strftime("%Y-%m-%d-%H%M", time.strptime(meta["started"][:19], "%Y-%m-%dT%H:%M:%S"))
    return directory / f"{stamp}-{meta['commit']}-{meta.get('label') or meta['bench']}.json"


def write_result(result: dict[str, Any], output: str | os.PathLike[str] | None = None) -> Path:
    """Write the run's JSON (`meta` first) to `output`, or into `bench/results/` by its name."""
    path = Path(output) if output else result_path(result["meta"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    return path
