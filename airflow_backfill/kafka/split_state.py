"""The per-partition (split) state machine of a source backfill.

A split's offset is the last Kafka offset the MV holds for that partition (-1: none).
`committed` is the source job's committed offset for the partition (-1: none yet):

- `Backfilling(o)`: the backfill reads the partition from Kafka. Once its offset equals
  `committed` the split is `Finished`; if it read past it (the source job lags or is
  stopped) it is `SourceCachingUp(o)`.
- `SourceCachingUp(o)`: nothing to read; waits until `committed >= o`, then `Finished`.
- `Finished(o)`: the MV follows the source table: its rows of this partition with
  offsets in `(o, committed]` (the ones at or below `o` are already applied, so no
  record is taken twice across the switch).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

BACKFILLING = "Backfilling"
SOURCE_CACHING_UP = "SourceCachingUp"
FINISHED = "Finished"
_KINDS = (BACKFILLING, SOURCE_CACHING_UP, FINISHED)
NO_OFFSET = -1


@dataclass(frozen=True)
class SplitState:
    """One partition's state and the last offset the MV holds for it."""

    kind: str
    offset: int = NO_OFFSET
    since: float | None = field(default=None, compare=False)
    """When the split entered this state and offset (seconds since the epoch; None in MVs
    committed before it was recorded). Not part of equality: a split that stays put is unchanged."""

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"unknown split state {self.kind!r}; expected one of {', '.join(_KINDS)}")
        if self.offset < NO_OFFSET:
            raise ValueError(f"split offset must be -1 (none) or more, got {self.offset}")

    def __str__(self) -> str:
        return f"{self.kind}({self.offset if self.offset != NO_OFFSET else 'None'})"

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"state": self.kind, "offset": self.offset}
        if self.since is not None:
            data["since"] = round(self.since, 3)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SplitState:
        since = data.get("since")
        return cls(str(data["state"]), int(data["offset"]), None if since is None else float(since))

    def moved_from(self, before: SplitState) -> SplitState:
        """This state stamped with the time it was entered: `before`'s time when the split
        stayed where it was, now when its state or offset changed."""
        if self == before:
            return SplitState(self.kind, self.offset, before.since)
        return SplitState(self.kind, self.offset, time.time())


def backfilling(offset: int = NO_OFFSET) -> SplitState:
    return SplitState(BACKFILLING, offset)


def after_backfill_read(offset: int, committed: int) -> SplitState:
    """The state once the backfill holds the partition up to `offset`."""
    if offset == committed:
        return SplitState(FINISHED, offset)
    if offset > committed:
        return SplitState(SOURCE_CACHING_UP, offset)
    return backfilling(offset)


def after_source_commit(state: SplitState, committed: int) -> SplitState:
    """A `SourceCachingUp` split finishes once the source job committed past its offset."""
    if state.kind == SOURCE_CACHING_UP and committed >= state.offset:
        return SplitState(FINISHED, state.offset)
    return state


def states_to_json(states: dict[int, SplitState]) -> dict[str, dict[str, Any]]:
    return {str(partition): state.to_json() for partition, state in sorted(states.items())}


def states_from_json(data: dict[str, Any]) -> dict[int, SplitState]:
    return {int(partition): SplitState.from_json(value) for partition, value in data.items()}
