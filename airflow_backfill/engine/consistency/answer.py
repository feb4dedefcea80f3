"""The answer of a consistent read: one Delta version per table, and the epochs they reflect.

Plain values throughout, so the answer travels as XCom and as JSON (`to_dict`,
`from_dict`) and a later task can open exactly those versions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_backfill.engine.consistency.tables import table_name

POLICY_COMMON = "common"
"""The default policy: the newest epochs every table has committed (`policies`)."""
DEFAULT_HISTORY = 1000
"""Versions of each MV searched at most, newest first, for epochs they share."""


@dataclass(frozen=True)
class TableVersion:
    """The version of one table to read, and the upstream epochs it reflects."""

    name: str
    uri: str
    version: int
    epochs: dict[str, int]
    """The version of each base table (by URI) this version reflects."""
    kind: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "uri": self.uri, "version": self.version, "epochs": dict(self.epochs),
                "kind": self.kind}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TableVersion:
        return cls(str(data["name"]), str(data["uri"]), int(data["version"]),
                   {str(base): int(epoch) for base, epoch in data["epochs"].items()}, str(data["kind"]))


@dataclass(frozen=True)
class LeftOut:
    """A table the answer does not read, and why."""

    name: str
    uri: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "uri": self.uri, "reason": self.reason}


@dataclass(frozen=True)
class ConsistentVersions:
    """Which version of each table to read."""

    policy: str
    tables: dict[str, TableVersion]
    """By table name, in the order they were asked for."""
    left_out: list[LeftOut] = field(default_factory=list)
    epochs: dict[str, int] = field(default_factory=dict)
    """The epoch of each base table that every version read reflects (`latest`: empty when
    the versions disagree)."""
    agree: bool = True
    """False only under `latest`, when two versions reflect one base table at different epochs."""

    def version(self, name: str) -> int:
        """The version to read of table `name`."""
        if name not in self.tables:
            raise KeyError(f"{name!r} is not among the tables read ({', '.join(self.tables)}); "
                           f"left out: {', '.join(t.name for t in self.left_out) or 'none'}.")
        return self.tables[name].version

    def to_dict(self) -> dict[str, Any]:
        return {"policy": self.policy, "agree": self.agree, "epochs": dict(self.epochs),
                "tables": {name: table.to_dict() for name, table in self.tables.items()},
                "left_out": [table.to_dict() for table in self.left_out]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ConsistentVersions:
        """The answer from `to_dict`'s plain values (an XCom a sensor pushed)."""
        return cls(
            policy=str(data["policy"]),
            tables={str(name): TableVersion.from_dict(table) for name, table in data["tables"].items()},
            left_out=[LeftOut(str(t["name"]), str(t["uri"]), str(t["reason"])) for t in data.get("left_out", [])],
            epochs={str(base): int(epoch) for base, epoch in (data.get("epochs") or {}).items()},
            agree=bool(data.get("agree", True)),
        )

    def lines(self) -> list[str]:
        """The answer for people: one line per table, then the tables left out."""
        width = max((len(name) for name in [*self.tables, *(t.name for t in self.left_out)]), default=4)
        lines = [f"policy {self.policy}: " + (_epochs_text(self.epochs) if self.agree else
                                               "the versions reflect different epochs")]
        for table in self.tables.values():
            lines.append(f"{table.name:<{width}}  version {table.version:<6} epochs {_epochs_text(table.epochs)}")
        for left in self.left_out:
            lines.append(f"{left.name:<{width}}  left out: {left.reason}")
        return lines


def _epochs_text(epochs: Mapping[str, int]) -> str:
    """`orders@1200, customers@310` (tables by folder name)."""
    return ", ".join(f"{table_name(base)}@{epoch}" for base, epoch in sorted(epochs.items())) or "-"
