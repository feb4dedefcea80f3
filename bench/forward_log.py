"""What the shared forward's log says: its rounds, its key checks and the JVM's code cache.

Every line of an MV's turn names the MV (`[name] ...`), so each figure is kept per kind of
MV. Rounds: the engine's `forward: applied ... (..., plan P) in S s` lines. Key checks: the
probe's lines (`bench/key_check_probe.py`) with their seconds and whether the upstream
was read, beside the engine's own lines in `rounds/key_check.py` that say which way
each check went. The code cache: HotSpot's `CodeCache is full` warning, stamped with the
JVM's uptime, and the errors of a JVM that ran out of it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

from bench.key_check_probe import PROBE_LINE
from bench.measure import median, percentile

LINE = re.compile(r"^(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ \S+: \[(?P<member>[^\]]+)\] (?P<message>.*)$")
APPLIED = re.compile(r"forward: applied .*?, plan (?P<plan>.*)\) in (?P<seconds>[\d.]+)s$")
PROBED = re.compile(re.escape(PROBE_LINE) + r"(?P<seconds>[\d.]+) s, (?P<how>.+)$")
ENGINE_READ = "upstream keys the round added checked at epoch"
ENGINE_SKIPPED = "upstream keys the round added lie above the upstream's largest key"
ENGINE_LOOKED_UP = "upstream keys the round added looked up at epoch"
HOW = {"upstream read": "upstream_read", "driver lookup": "driver_lookup", "no upstream read": "no_upstream_read"}
CODE_CACHE_FULL = re.compile(r"^\[(?P<uptime>[\d.]+)s\]\[warning\]\[codecache\] CodeCache is full")
OUT_OF_CODE_CACHE = "Out of space in CodeCache"


def member_lines(text: str, start: float | None = None, end: float | None = None) -> Iterator[tuple[str, str]]:
    """(member, message) of each line an MV's turn wrote, stamped within [start, end]."""
    for line in text.splitlines():
        found = LINE.match(line)
        if found is None:
            continue
        at = time.mktime(time.strptime(found["at"][:19], "%Y-%m-%d %H:%M:%S")) + int(found["at"][20:]) / 1000
        if (start is None or at >= start) and (end is None or at <= end):
            yield found["member"], found["message"]


def _seconds(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"count": 0}
    return {"count": len(values), "median_s": round(median(values), 3), "p90_s": round(percentile(values, 0.9), 3),
            "max_s": round(max(values), 3), "total_s": round(sum(values), 1)}


def rounds(text: str, kinds: dict[str, str], start: float | None = None, end: float | None = None) -> dict[str, Any]:
    """Per kind: every round the log shows in the window, its seconds and plans."""
    seconds: dict[str, list[float]] = {}
    plans: dict[str, dict[str, int]] = {}
    for member, message in member_lines(text, start, end):
        found = APPLIED.search(message)
        if found is None or member not in kinds:
            continue
        kind = kinds[member]
        seconds.setdefault(kind, []).append(float(found["seconds"]))
        plan = plans.setdefault(kind, {})
        plan[found["plan"]] = plan.get(found["plan"], 0) + 1
    return {kind: {**_seconds(values), "plans": plans[kind]} for kind, values in sorted(seconds.items())}


def key_checks(text: str, kinds: dict[str, str], start: float | None = None, end: float | None = None) -> dict[str, Any]:
    """Per kind and in all: the checks that read the upstream and those that did not, with
    their seconds (probe lines), and the engine's own count of each way."""
    probed: dict[str, dict[str, list[float]]] = {}
    engine = {how: 0 for how in HOW.values()}
    for member, message in member_lines(text, start, end):
        found = PROBED.search(message)
        if found is not None:
            how = HOW.get(found["how"], "no_upstream_read")
            probed.setdefault(kinds.get(member, "other"), {}).setdefault(how, []).append(float(found["seconds"]))
        elif ENGINE_READ in message:
            engine["upstream_read"] += 1
        elif ENGINE_LOOKED_UP in message:
            engine["driver_lookup"] += 1
        elif ENGINE_SKIPPED in message:
            engine["no_upstream_read"] += 1
    every: dict[str, list[float]] = {how: [] for how in HOW.values()}
    for ways in probed.values():
        for how, values in ways.items():
            every[how] += values
    return {"all": {how: _seconds(values) for how, values in every.items()},
            "kinds": {kind: {how: _seconds(values) for how, values in ways.items()} for kind, ways in sorted(probed.items())},
            "engine_lines": engine,
            "probed": any(every.values())}


def code_cache(text: str) -> dict[str, Any]:
    """Whether HotSpot said its code cache was full, at what JVM uptime, and how many
    errors said it ran out of it (an executor thread dying of one stops the application)."""
    full = next((float(found["uptime"]) for line in text.splitlines()
                 if (found := CODE_CACHE_FULL.match(line)) is not None), None)
    if full is None and "CodeCache is full" in text:
        full = -1.0  # said without the unified-logging stamp
    return {"full": full is not None, "at_jvm_uptime_s": full if full is not None and full >= 0 else None,
            "out_of_code_cache_errors": text.count(OUT_OF_CODE_CACHE)}
