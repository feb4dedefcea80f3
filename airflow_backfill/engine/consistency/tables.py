"""What a consistent read needs to know about each table: where it is, and how one of its
versions says which upstream epochs it reflects.

Four kinds of table, each telling its epochs its own way:

- `table`: a Delta table no job writes (an upstream, a Kafka source table): its version
  is its epoch.
- `mv`: an MV over one upstream: its app transaction (`airflow_backfill/<job>`) is the
  upstream version it reflects.
- `join`: an MV over several upstreams: the vector `{name: version}` in the userMetadata
  of the commit that carries the app transaction (their sum).
- `recorded`: an MV that records its upstream version in a userMetadata field of each
  commit (a Kafka MV: the source table's version once every split is Finished; null
  before).

An upstream may itself be an MV (MV-on-MV), so an MV's epochs are mapped through its
upstream's versions down to the base tables. A spec is plain data, so a trigger can
serialize it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_backfill.exceptions import BackfillConfigError, TargetError

if TYPE_CHECKING:
    from airflow_backfill.job import BackfillJob

KIND_TABLE = "table"
KIND_MV = "mv"
KIND_JOIN = "join"
KIND_RECORDED = "recorded"
KINDS = (KIND_TABLE, KIND_MV, KIND_JOIN, KIND_RECORDED)
SINGLE_UPSTREAM = "source"
"""The upstream's name in the spec of an MV over one upstream."""
JOB_FIELD = "job"
SOURCE_FIELD = "source"
RECORDED_FIELD = "watermark"
"""The userMetadata field in which an MV whose app transaction counts rounds, not epochs,
records its upstream version (a Kafka MV)."""
DISCOVERY_DEPTH = 100
"""Commits of an unnamed upstream read to learn whether a job wrote it, newest first."""


@dataclass(frozen=True)
class TableSpec:
    """One table of a consistent read."""

    name: str
    """How the answer names the table: the job's name, or the table's folder name."""
    uri: str
    kind: str
    app_id: str | None = None
    """The app transaction of the job that writes the table (None for `table`)."""
    upstreams: Mapping[str, str] = field(default_factory=dict)
    """The tables the MV reads, by the name its recorded versions use."""
    epoch_field: str | None = None
    """`recorded`: the userMetadata field (without the `airflow_backfill.` prefix)."""
    explicit: bool = True
    """Named by the reader: read even while it is being created. A table that is only part
    of a set (all the jobs of a folder) is left out then, so that it holds nobody back."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise BackfillConfigError(f"table kind must be one of {', '.join(KINDS)}, got {self.kind!r}.")
        if self.kind != KIND_TABLE and (not self.app_id or not self.upstreams):
            raise BackfillConfigError(f"{self.name}: an MV's spec needs its app_id and its upstreams.")
        if self.kind == KIND_RECORDED and not self.epoch_field:
            raise BackfillConfigError(f"{self.name}: a `recorded` spec needs the epoch_field it reads.")

    def to_dict(self) -> dict[str, Any]:
        """Plain values (a trigger's kwargs); `from_dict` turns them back into this spec."""
        return {"name": self.name, "uri": self.uri, "kind": self.kind, "app_id": self.app_id,
                "upstreams": dict(self.upstreams), "epoch_field": self.epoch_field, "explicit": self.explicit}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TableSpec:
        return cls(name=str(data["name"]), uri=str(data["uri"]), kind=str(data["kind"]), app_id=data.get("app_id"),
                   upstreams=dict(data.get("upstreams") or {}), epoch_field=data.get("epoch_field"),
                   explicit=bool(data.get("explicit", True)))


def spec_for_job(job: BackfillJob, *, explicit: bool = True) -> TableSpec:
    """The spec of a job's MV (one upstream, or a join)."""
    if job.is_join:
        return TableSpec(job.name, job.target, KIND_JOIN, job.app_id,
                         {upstream.name: upstream.table for upstream in job.upstreams}, explicit=explicit)
    return TableSpec(job.name, job.target, KIND_MV, job.app_id, {SINGLE_UPSTREAM: job.source}, explicit=explicit)


def table_name(uri: str) -> str:
    """A table's default name: the last part of its path."""
    return os.path.basename(uri.rstrip("/")) or uri


def spec_for_table(uri: str, *, name: str | None = None, explicit: bool = True) -> TableSpec:
    """The spec of a table named by its URI: an MV when a job of the Delta phases wrote it
    (its commits say which job, over which upstreams), else a table whose versions are
    its epochs.

    A table whose commits record a `watermark` without their job (a Kafka MV) cannot be
    mapped to its upstream from its log alone: refused, asking for its job file.
    """
    # Imported here: DAG files build these specs, and parsing a DAG must not load delta-rs.
    from airflow_backfill.engine.delta.log import commit_history, commit_metadata, table_exists

    name = name or table_name(uri)
    if not table_exists(uri):
        raise TargetError(f"{name}: {uri} is not a Delta table (no _delta_log); check the path or the job's target.")
    for entry in commit_history(uri, limit=DISCOVERY_DEPTH):
        metadata = commit_metadata(entry)
        if JOB_FIELD in metadata and SOURCE_FIELD in metadata:
            return _written_by_job(name, uri, str(metadata[JOB_FIELD]), metadata[SOURCE_FIELD], explicit)
        if RECORDED_FIELD in metadata:
            raise BackfillConfigError(
                f"{name}: {uri} is an MV whose log does not say which table it reads (a Kafka MV); name its job "
                "file too (airflow-backfill consistent --job FILE), so its epochs can be mapped to its source table."
            )
    return TableSpec(name, uri, KIND_TABLE, explicit=explicit)


def _written_by_job(name: str, uri: str, job: str, source: Any, explicit: bool) -> TableSpec:
    """The spec of an MV from its commits' `job` and `source` (a URI, or a join's JSON
    object of URIs by upstream name)."""
    app_id = f"airflow_backfill/{job}"
    if isinstance(source, str) and source.startswith("{"):
        upstreams = json.loads(source)
        return TableSpec(name, uri, KIND_JOIN, app_id, {str(k): str(v) for k, v in upstreams.items()},
                         explicit=explicit)
    return TableSpec(name, uri, KIND_MV, app_id, {SINGLE_UPSTREAM: str(source)}, explicit=explicit)
