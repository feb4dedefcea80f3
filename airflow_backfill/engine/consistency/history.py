"""The upstream epochs each version of a table reflects, read from its Delta log.

A version's epochs are a mapping `{base table URI: version}`: for a table no job writes,
its own version; for an MV, the versions its upstreams were at, mapped through each
upstream's own history when that upstream is an MV too (an MV over an MV records the
upstream MV's version, which reflects the base upstream's epoch through its own app
transaction). Commits are read newest first and only as far as a question needs, each
log entry at most once.

A version reflects the epochs of the newest commit up to it that carries the job's app
transaction, provided no commit in between changed data (a compaction by `maintain`
changes files, not rows). A version whose data changed without the app transaction
reflects no epoch: it is nobody's consistent state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow_backfill.engine.consistency.tables import (
    KIND_JOIN,
    KIND_MV,
    KIND_TABLE,
    SINGLE_UPSTREAM,
    TableSpec,
)
from airflow_backfill.engine.delta.log import commit_actions, commit_metadata, latest_version
from airflow_backfill.engine.joins.watermarks import WATERMARKS, recorded_vector, vector_sum
from airflow_backfill.exceptions import TargetError

Epochs = dict[str, int]
"""The version of each base table a table version reflects, by the base table's URI."""


@dataclass(frozen=True)
class Commit:
    """What one log entry says about the epochs of its version."""

    version: int
    txn: int | None
    """The job's app transaction version in this commit (None when it sets none)."""
    metadata: dict[str, Any]
    """Its `airflow_backfill.*` userMetadata, without the prefix."""
    data_change: bool
    """Whether it adds or removes rows (files with `dataChange`, or change files)."""


def read_commit(uri: str, version: int, app_id: str | None) -> Commit | None:
    """Log entry `version` of the table at `uri`; None when the entry is gone (log retention)."""
    actions = commit_actions(uri, version)
    if not actions:
        return None
    txn = None
    metadata: dict[str, Any] = {}
    data_change = False
    for action in actions:
        if "txn" in action and action["txn"].get("appId") == app_id:
            txn = int(action["txn"]["version"])
        elif "commitInfo" in action:
            metadata = commit_metadata(action["commitInfo"])
        elif "cdc" in action or any(kind in action and action[kind].get("dataChange", True)
                                    for kind in ("add", "remove")):
            data_change = True
    return Commit(version, txn, metadata, data_change)


class TableHistory:
    """One table's versions and the epochs each reflects.

    :param spec: the table.
    :param upstreams: the history of each upstream, by the name the MV's recorded versions
        use (empty for a table no job writes).
    """

    def __init__(self, spec: TableSpec, upstreams: Mapping[str, TableHistory]) -> None:
        self.spec = spec
        self.upstreams = dict(upstreams)
        self.latest = latest_version(spec.uri)
        self._commits: dict[int, Commit | None] = {}
        self._recorded: dict[int, dict[str, int] | None] = {}
        self._epochs: dict[int, Epochs | None] = {}
        self.log_ends_at: int | None = None
        """The newest version found without its log entry (the log ends above it), once seen."""

    @property
    def is_base(self) -> bool:
        return self.spec.kind == KIND_TABLE

    def bases(self) -> set[str]:
        """The URIs of the base tables this table's epochs name."""
        if self.is_base:
            return {self.spec.uri}
        return set().union(*(upstream.bases() for upstream in self.upstreams.values()))

    def epochs_at(self, version: int) -> Epochs | None:
        """The base epochs version `version` reflects; None when it reflects none (before
        the first watermark, data changed without one, a Kafka MV not Finished, an
        upstream version that reflects none, or a log entry that is gone)."""
        if version < 0 or version > self.latest:
            return None
        if self.is_base:
            return {self.spec.uri: version}
        if version not in self._epochs:
            self._epochs[version] = self._map_to_bases(self._recorded_at(version))
        return self._epochs[version]

    def candidates(self, depth: int) -> list[tuple[int, Epochs]]:
        """The newest `depth` versions' distinct epochs, newest first, each with the newest
        version that reflects them (later versions of the same epochs only compacted files)."""
        found: list[tuple[int, Epochs]] = []
        seen: set[tuple[tuple[str, int], ...]] = set()
        for version in range(self.latest, max(-1, self.latest - depth), -1):
            if not self.is_base and self._commit(version) is None:
                break  # older entries are gone too: log retention cleaned them
            epochs = self.epochs_at(version)
            if epochs is None:
                continue
            key = tuple(sorted(epochs.items()))
            if key not in seen:
                seen.add(key)
                found.append((version, epochs))
        return found

    def _commit(self, version: int) -> Commit | None:
        if version not in self._commits:
            commit = read_commit(self.spec.uri, version, self.spec.app_id)
            self._commits[version] = commit
            if commit is None and (self.log_ends_at is None or version > self.log_ends_at):
                self.log_ends_at = version
        return self._commits[version]

    def _recorded_at(self, version: int) -> dict[str, int] | None:
        """The upstream versions (by upstream name) the MV at `version` records."""
        walked: list[int] = []
        result: dict[str, int] | None = None
        current = version
        while current >= 0:
            if current in self._recorded:
                result = self._recorded[current]
                break
            commit = self._commit(current)
            walked.append(current)
            if commit is None:
                break
            if commit.txn is not None:
                result = self._upstream_versions(commit)
                break
            if commit.data_change:
                break
            current -= 1
        for walked_version in walked:
            self._recorded[walked_version] = result
        return result

    def _upstream_versions(self, commit: Commit) -> dict[str, int] | None:
        """What one commit with the app transaction records, by upstream name."""
        assert commit.txn is not None
        if self.spec.kind == KIND_MV:
            return {SINGLE_UPSTREAM: commit.txn}
        if self.spec.kind == KIND_JOIN:
            vector = recorded_vector(commit.metadata)
            names = sorted(self.spec.upstreams)
            if vector is None or sorted(vector) != names or vector_sum(vector) != commit.txn:
                raise TargetError(
                    f"{self.spec.name}: version {commit.version} of {self.spec.uri} records upstream versions "
                    f"{vector} (metadata `{WATERMARKS}`) that do not match its watermark {commit.txn} over the "
                    f"upstreams {names}: another job wrote it, or a different version of this one. Name the job "
                    "that writes it, or rebuild the MV."
                )
            return vector
        value = commit.metadata.get(self.spec.epoch_field or "")
        return None if value is None else {SINGLE_UPSTREAM: int(value)}

    def _map_to_bases(self, recorded: dict[str, int] | None) -> Epochs | None:
        """Upstream versions by name turned into base epochs; None when any upstream version
        reflects none, or when two upstreams reflect one base table at different versions."""
        if recorded is None:
            return None
        epochs: Epochs = {}
        for name, version in recorded.items():
            upstream = self.upstreams[name].epochs_at(version)
            if upstream is None:
                return None
            for base, epoch in upstream.items():
                if epochs.setdefault(base, epoch) != epoch:
                    return None
        return epochs
