"""Where the source job and a source backfill stand, read from their Delta logs with delta-rs.

Both record their per-partition offsets in the `userMetadata` of the commit that wrote
the rows, so a position is always consistent with the data. No Spark here: the
sensor, the status command and the operators read positions from Airflow processes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from airflow_backfill.engine.delta.log import commit_history, commit_metadata, table_exists
from airflow_backfill.kafka.split_state import FINISHED, NO_OFFSET, SplitState, states_from_json

OFFSETS_FIELD = "kafka_offsets"
SPLITS_FIELD = "kafka_splits"
ROUND_FIELD = "kafka_round"
SOURCE_VERSION_FIELD = "source_version"
WATERMARK_FIELD = "watermark"
_HISTORY_DEPTH = 100


@dataclass(frozen=True)
class SourcePosition:
    """The source job's committed offsets (last offset per partition) at Delta `version`."""

    version: int | None = None
    offsets: dict[int, int] = field(default_factory=dict)
    round: int = 0

    def committed(self, partition: int) -> int:
        return self.offsets.get(partition, NO_OFFSET)


@dataclass(frozen=True)
class BackfillPosition:
    """A source backfill's per-partition states, as of the MV's latest commit."""

    splits: dict[int, SplitState] = field(default_factory=dict)
    round: int = 0
    source_version: int | None = None
    mv_version: int | None = None

    @property
    def finished(self) -> bool:
        return bool(self.splits) and all(state.kind == FINISHED for state in self.splits.values())

    @property
    def offsets(self) -> dict[int, int]:
        return {partition: state.offset for partition, state in self.splits.items()}


def _latest_with(uri: str, key: str) -> tuple[int, dict[str, Any]] | None:
    """(version, metadata) of the latest commit carrying `airflow_backfill.<key>`."""
    if not table_exists(uri):
        return None
    for entry in commit_history(uri, limit=_HISTORY_DEPTH):
        metadata = commit_metadata(entry)
        if key in metadata:
            return int(entry["version"]), metadata
    return None


def source_position(table: str) -> SourcePosition:
    """The source job's committed offsets ({} and version None before its first commit)."""
    found = _latest_with(table, OFFSETS_FIELD)
    if found is None:
        return SourcePosition()
    version, metadata = found
    offsets = {int(p): int(o) for p, o in metadata[OFFSETS_FIELD].items()}
    return SourcePosition(version=version, offsets=offsets, round=int(metadata.get(ROUND_FIELD, 0)))


def backfill_position(target: str) -> BackfillPosition:
    """The source backfill's split states (none before its first commit)."""
    found = _latest_with(target, SPLITS_FIELD)
    if found is None:
        return BackfillPosition()
    version, metadata = found
    source_version = metadata.get(SOURCE_VERSION_FIELD)
    return BackfillPosition(
        splits=states_from_json(metadata[SPLITS_FIELD]),
        round=int(metadata.get(ROUND_FIELD, 0)),
        source_version=None if source_version is None else int(source_version),
        mv_version=version,
    )
