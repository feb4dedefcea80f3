"""What an MV's asset events carry, whoever emits them.

A phase task (snapshot, catch-up, a bounded forward) emits an event on the MV's Asset
when it ends, with these fields as the event's `extra`. The MV's watcher
(`triggers/mv_commits.py`, running in the triggerer) emits one for the newest commits of
the forward phases while they run (the shared forward's included), with the same fields;
Airflow stores a watcher's payload under the event's `extra["payload"]`, so a downstream
task reads either shape with `mv_event_fields(event)`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_backfill.hooks.delta import DeltaBackfillHook

log = logging.getLogger(__name__)

PREFIX = "airflow_backfill."
WATERMARK = PREFIX + "watermark"
MV_VERSION = PREFIX + "mv_version"
COMMITS = PREFIX + "commits"
"""A watcher's event: how many commits that moved the watermark it covers (coalesced)."""
PREVIOUS_MV_VERSION = PREFIX + "previous_mv_version"
"""A watcher's event: the MV version of the watcher's previous event (None: unknown)."""
COMMITTED_AT = PREFIX + "committed_at"
"""A watcher's event: when the MV version was committed (its commitInfo, ms since the epoch)."""


def event_extra(hook: DeltaBackfillHook, *, job: str, phase: str, watermark: int | None,
                version: int | None = None) -> dict[str, Any]:
    """The `airflow_backfill.*` fields of an event for the MV as of its version `version`
    (None: the version that set `watermark`, else the latest): job, phase, watermark,
    source, a join's watermark of each upstream, the MV version with the base upstream
    epochs it reflects (through MV-on-MV chains) and the readers that read its feed
    exactly. One function for the tasks' and the watcher's events, so a downstream DAG
    reads the same fields from both, and the MV version always holds the watermark named
    (the shared forward may commit between a phase's end and its event)."""
    if version is None and watermark is not None:
        version = hook.commit_of(watermark)
    extra: dict[str, Any] = {
        PREFIX + "job": job, PREFIX + "phase": phase, WATERMARK: watermark, PREFIX + "source": hook.source,
    }
    if hook.is_join:
        extra[PREFIX + "watermarks"] = hook.watermarks(up_to=version)
    extra.update(_upstream_epochs(hook, job, version))
    extra[PREFIX + "feed_readers"] = hook.feed_readers()
    return extra


def _upstream_epochs(hook: DeltaBackfillHook, job: str, version: int | None) -> dict[str, Any]:
    """The MV version and the version of each base upstream it reflects: what a downstream
    DAG needs to read several MVs at one epoch (docs/consistent-reads.md). Left out, with a
    warning, when the logs cannot tell: the commit stands either way."""
    from airflow_backfill.engine.consistency.policies import current_epochs, epochs_at
    from airflow_backfill.engine.consistency.tables import KIND_JOIN, KIND_MV, TableSpec
    from airflow_backfill.exceptions import BackfillError

    spec = TableSpec(job, hook.target, KIND_JOIN if hook.is_join else KIND_MV, hook.app_id, hook.upstreams)
    try:
        hook.register_storage()
        if version is None:
            current = current_epochs(spec)
        else:
            epochs = epochs_at(spec, version)
            current = None if epochs is None else (version, epochs)
    except (BackfillError, OSError) as error:
        log.warning("the asset event carries no upstream epochs: %s", error)
        return {}
    if current is None:
        return {}
    return {MV_VERSION: current[0], PREFIX + "upstream_epochs": current[1]}


def mv_event_fields(event: Any) -> dict[str, Any]:
    """The `airflow_backfill.*` fields of one asset event on an MV (an entry of
    `triggering_asset_events[asset]`, or its `extra` mapping), whichever emitted it: a
    task puts them in the `extra`, Airflow puts a watcher's under `extra["payload"]`.
    {} for an event that carries none (one emitted by hand or by another tool)."""
    extra = event if isinstance(event, Mapping) else getattr(event, "extra", None) or {}
    payload = extra.get("payload")
    if extra.get("from_trigger") and isinstance(payload, Mapping):
        extra = payload
    return {key: value for key, value in extra.items() if key.startswith(PREFIX)}
