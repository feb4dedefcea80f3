"""One log line on how far a folder's backfill is: what is built, building, waiting and failing.

The shared forward's task log is where a folder backfilled as one is followed (each MV's
own lines name it, `log_names`); this line is the summary every `progress_interval`
seconds, until every MV is built.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol


class _Named(Protocol):
    name: str


class BackfillState(Protocol):
    """What the line reads of a member's status (`loop.MemberStatus`)."""

    @property
    def member(self) -> _Named: ...

    backfill: bool | None
    backfilling: bool
    backfill_seconds: float | None
    last_error: str | None
    waiting: str | None

NAMES_SHOWN = 8
"""Names listed per group before `... and N more`: fifty MVs keep the line readable."""


def _names(items: list[str]) -> str:
    shown = ", ".join(items[:NAMES_SHOWN])
    return shown if len(items) <= NAMES_SHOWN else f"{shown} and {len(items) - NAMES_SHOWN} more"


def progress_line(statuses: Iterable[BackfillState]) -> str | None:
    """`folder backfill: 3 of 5 MVs built; building: a, b; waiting: c (backfill waits for a);
    failing: d (TargetError: ...)`, or None when no MV was built here."""
    built: list[str] = []
    building: list[str] = []
    waiting: list[str] = []
    failing: list[str] = []
    for status in statuses:
        name = status.member.name
        if status.backfill_seconds is not None:
            built.append(name)
        elif not status.backfill:
            continue
        elif status.backfilling:
            building.append(name)
        elif status.last_error:
            failing.append(f"{name} ({status.last_error[:160]})")
        else:
            waiting.append(f"{name} ({status.waiting})" if status.waiting else name)
    total = len(built) + len(building) + len(waiting) + len(failing)
    if not total:
        return None
    parts = [f"folder backfill: {len(built)} of {total} MVs built"]
    for label, items in (("building", building), ("waiting", waiting), ("failing", failing)):
        if items:
            parts.append(f"{label}: {_names(items)}")
    return "; ".join(parts)
