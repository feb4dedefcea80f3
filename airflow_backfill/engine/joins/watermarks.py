"""The vector watermark of a join MV: one upstream version per upstream, atomic with the data.

Delta's app transaction holds one number per app id, and a commit is skipped unless it
is above the recorded one. A join MV records there the *sum* of its upstreams' versions:
a round moves every upstream forward or leaves it, so the sum grows with every round
that moves any of them, and two different vectors a run could commit after a given one
can never be skipped wrongly (each is above it componentwise, hence in sum). The vector
itself travels in the same commit's `userMetadata`, as `airflow_backfill.watermarks`
(a JSON object `{name: version}`, in a string like every other value there), so delta-rs
readers take it from the newest commit that carries it. Both are written by the same
atomic commit; a reader (and every round, before it applies anything) checks that the
vector sums to the app transaction and names exactly the job's upstreams, and refuses
to go on otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_backfill.engine.delta.log import (
    commit_history,
    commit_metadata,
    commit_timestamp,
    latest_version,
    read_watermark,
    table_at,
    table_exists,
)
from airflow_backfill.exceptions import TargetError

if TYPE_CHECKING:
    from airflow_backfill.engine.delta.commits import CommitInfo
    from airflow_backfill.job import BackfillJob

Vector = dict[str, int]
"""A version of each upstream, by the upstream's name in the job's `sources`."""

WATERMARKS = "watermarks"
"""The commit metadata field (`airflow_backfill.watermarks`) that holds the vector."""
_HISTORY_PAGE = 20


def vector_sum(vector: Mapping[str, int]) -> int:
    """The app transaction version that stands for `vector`."""
    return sum(vector.values())


def latest_vector(job: BackfillJob) -> Vector:
    """Every upstream's latest version (read from the logs' file names)."""
    return {upstream.name: latest_version(upstream.table) for upstream in job.upstreams}


def pending_epochs(watermarks: Mapping[str, int], latest: Mapping[str, int]) -> dict[str, int]:
    """Per upstream, the versions the MV has not applied yet."""
    return {name: max(0, latest[name] - version) for name, version in watermarks.items()}


def vector_metadata(job: BackfillJob, vector: Mapping[str, int]) -> dict[str, str]:
    """The commit metadata of a join MV commit besides the usual fields: its upstreams (as
    `source`) and the vector."""
    return {"source": json.dumps({u.name: u.table for u in job.upstreams}, sort_keys=True),
            WATERMARKS: json.dumps(dict(vector), sort_keys=True)}


def join_commit_info(job: BackfillJob, info: CommitInfo, vector: Mapping[str, int]) -> CommitInfo:
    """`info` with the vector and the upstreams in its metadata (its epoch is the sum)."""
    from dataclasses import replace

    return replace(info, epoch=vector_sum(vector), extra={**info.extra, **vector_metadata(job, vector)})


def recorded_vector(metadata: Mapping[str, Any]) -> Vector | None:
    """The vector one commit's `airflow_backfill.*` metadata carries (None when none)."""
    text = metadata.get(WATERMARKS)
    if text is None:
        return None
    value = json.loads(text) if isinstance(text, str) else text
    return {str(name): int(version) for name, version in value.items()}


def table_vector(uri: str, app_id: str, names: list[str], *, up_to: int | None = None) -> Vector | None:
    """The vector of the table at `uri` (an MV or its aggregate state; as of its version
    `up_to`, else the latest), checked against its app transaction; None while it has no
    watermark (not created yet)."""
    if up_to is None:
        watermark = read_watermark(uri, app_id)
    else:
        watermark = table_at(uri, up_to).transaction_version(app_id)
    if watermark is None:
        return None
    vector = _newest_vector(uri, up_to)
    if vector is None or sorted(vector) != sorted(names) or vector_sum(vector) != watermark:
        raise TargetError(
            f"{uri} records upstream versions {vector} that do not match its watermark {watermark} "
            f"(app transaction {app_id}) over the upstreams {sorted(names)}: it was written by another "
            "job or a different version of this one. Nothing was applied; rebuild the MV (delete the "
            "target and rerun the snapshot) or restore the job's `sources`."
        )
    return vector


def committed_vector(job: BackfillJob) -> Vector | None:
    """The upstream versions the job's MV reflects; None before its snapshot committed."""
    return table_vector(job.target, job.app_id, [upstream.name for upstream in job.upstreams])


def _newest_vector(uri: str, up_to: int | None = None) -> Vector | None:
    """The vector of the newest commit (up to version `up_to`) that carries one
    (maintenance commits carry none)."""
    limit = _HISTORY_PAGE
    while True:
        history = commit_history(uri, limit=limit)
        for entry in history:
            if up_to is not None and entry["version"] > up_to:
                continue
            vector = recorded_vector(commit_metadata(entry))
            if vector is not None:
                return vector
        if len(history) < limit:
            return None
        limit *= 4


def seconds_behind(job: BackfillJob, vector: Mapping[str, int]) -> dict[str, float]:
    """Per upstream: commit time of its latest version minus that of the version applied."""
    behind: dict[str, float] = {}
    for upstream in job.upstreams:
        if not table_exists(upstream.table):
            continue
        latest = latest_version(upstream.table)
        newest, applied = commit_timestamp(upstream.table, latest), commit_timestamp(upstream.table, vector[upstream.name])
        behind[upstream.name] = 0.0 if newest is None or applied is None else max(0.0, (newest - applied) / 1000.0)
    return behind


def latest_epoch(job: BackfillJob) -> int | None:
    """The upstream's latest version (a join: the sum of its upstreams', the scale of its
    watermark); None while an upstream does not exist yet."""
    if not all(table_exists(upstream.table) for upstream in job.upstreams):
        return None
    return sum(latest_version(upstream.table) for upstream in job.upstreams)
