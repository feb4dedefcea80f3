"""The MV's lag over time, from the Delta logs alone: for each MV commit, how far the MV
was behind its upstream when the commit landed.

An MV commit at time `t` records the upstream epoch `e` it reflects; the upstream's
latest epoch at `t` is the last version committed by then (its log's commit times). The
lag then was that many epochs, and that latest epoch's commit time minus `e`'s seconds,
the same two measures `status` gives for now. Nothing here depends on a running phase,
so the history survives retries and crashes like the rest of the status.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_backfill.engine.delta.log import commit_timestamp


@dataclass(frozen=True)
class LagPoint:
    """The MV's lag right after one of its commits."""

    at: float
    """When the MV commit landed (seconds since the epoch)."""
    epochs: int
    """Upstream epochs committed by then that the MV did not reflect yet."""
    seconds: float
    """Commit time of the upstream's latest epoch then, minus that of the MV's epoch."""
    phase: str | None
    mv_version: int | None


class CommitTimes:
    """Upstream commit times by version, each read once: a committed version's time never
    changes, so a process can keep them (the oldest are dropped past `limit`)."""

    def __init__(self, read: Callable[[str, int], int | None] = commit_timestamp, limit: int = 100_000) -> None:
        self._read = read
        self._limit = limit
        self._times: OrderedDict[tuple[str, int], int | None] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, uri: str, version: int) -> int | None:
        key = (uri, version)
        with self._lock:
            if key in self._times:
                return self._times[key]
        value = self._read(uri, version)
        with self._lock:
            self._times[key] = value
            while len(self._times) > self._limit:
                self._times.popitem(last=False)
        return value


def latest_version_at(uri: str, at_ms: int, low: int, high: int,
                      timestamp_of: Callable[[str, int], int | None]) -> int | None:
    """The last version in [low, high] committed at or before `at_ms` (binary search over the
    log's commit times, which grow with the version); None when `low` came later."""
    first = timestamp_of(uri, low)
    if first is None or first > at_ms:
        return None
    while low < high:
        middle = (low + high + 1) // 2
        stamp = timestamp_of(uri, middle)
        if stamp is not None and stamp <= at_ms:
            low = middle
        else:
            high = middle - 1
    return low


def lag_history(source: str, commits: Iterable[Mapping[str, Any]], upstream_version: int | None,
                timestamp_of: Callable[[str, int], int | None] = commit_timestamp) -> list[LagPoint]:
    """One point per MV commit of a phase (`status.mv_commits`, any order), oldest first; a
    snapshot's chunk commits are left out: the MV does not exist for its readers until the
    snapshot's last commit."""
    if upstream_version is None:
        return []
    points = []
    for commit in sorted(commits, key=lambda entry: entry.get("version") or 0):
        epoch, at_ms = commit.get("epoch"), commit.get("timestamp")
        if commit.get("phase") is None or not isinstance(epoch, int) or not isinstance(at_ms, int) \
                or epoch > upstream_version:
            continue
        latest = latest_version_at(source, at_ms, epoch, upstream_version, timestamp_of)
        if latest is None:
            continue
        newest, applied = timestamp_of(source, latest), timestamp_of(source, epoch)
        seconds = 0.0 if newest is None or applied is None else max(0.0, (newest - applied) / 1000.0)
        points.append(LagPoint(at=at_ms / 1000.0, epochs=latest - epoch, seconds=round(seconds, 3),
                               phase=commit.get("phase"), mv_version=commit.get("version")))
    return points
