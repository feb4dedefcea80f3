"""What the upstreams' writers committed in the measured window, read from the upstreams' logs.

Per upstream: its commits in the window and their rate, the engine that made them
(`engineInfo`), and, for the users' writers, each commit's kind and rows as the writer
recorded them (`bench.commit_kind` in delta-rs' commit metadata or Spark's userMetadata).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.writers import KIND_FIELD


def commit_infos(uri: str) -> list[dict[str, Any]]:
    """Each version's commitInfo, its userMetadata parsed into it, in version order."""
    infos = []
    for path in sorted((Path(uri) / "_delta_log").glob("*.json")):
        if not path.stem.isdigit():
            continue
        for line in path.read_text().splitlines():
            action = json.loads(line)
            if "commitInfo" in action:
                info = dict(action["commitInfo"])
                try:
                    info.update(json.loads(info.get("userMetadata") or "{}"))
                except ValueError:
                    pass
                infos.append({"version": int(path.stem), **info})
    return infos


def summary(upstreams: Sequence[str], start: float, end: float) -> dict[str, Any]:
    seconds = max(end - start, 1e-9)
    tables: dict[str, Any] = {}
    for uri in upstreams:
        window = [info for info in commit_infos(uri) if start <= (info.get("timestamp") or 0) / 1000.0 < end]
        kinds: dict[str, int] = {}
        for info in window:
            kind = str(info.get(KIND_FIELD, info.get("operation", "?")))
            kinds[kind] = kinds.get(kind, 0) + 1
        engines = sorted({str(info.get("engineInfo", "?")).split("/")[0].split(":")[0] for info in window})
        rows = [int(info["bench.rows"]) for info in window if "bench.rows" in info]
        tables[Path(uri).name] = {"commits": len(window), "commits_per_s": round(len(window) / seconds, 3),
                                  "kinds": kinds, "engines": engines, "rows": sum(rows)}
    total = sum(table["commits"] for table in tables.values())
    return {"commits": total, "commits_per_s": round(total / seconds, 3), "upstreams": tables}
