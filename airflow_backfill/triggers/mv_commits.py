"""The MV's watcher: turns the commits of a running forward into asset events on the MV.

Airflow 3 records an asset event when a task that declares the asset ends, or when an
`AssetWatcher`'s trigger fires in the triggerer. A forward (the shared forward of a job
folder, or one MV's forward task) commits for as long as it lives, so only a watcher can
tell Airflow about its commits. This trigger reads the MV's Delta log (delta-rs through
`DeltaBackfillHook`: no Spark, no DAG code; its kwargs are plain values) and fires for the
newest forward commit that moved the watermark, with the `extra` the phase tasks' events
carry (`asset_events.event_extra`).

Rate: the log is read every `poll_interval` seconds, one event at most per read, and none
sooner than `min_interval` seconds after the previous event: the commits in between are
coalesced into the next event, which names the newest (its watermark, MV version and
epochs), how many commits it covers (`airflow_backfill.commits`) and the MV version of the
previous event (`airflow_backfill.previous_mv_version`).

Restarts: a triggerer restart, a move to another triggerer or a changed DAG starts the
trigger again from its kwargs. One read after each event (so after the triggerer had time
to store the event) the trigger records the event's MV version in the asset's state store;
a restarted trigger continues after the recorded version, or, with none recorded, sends
the newest forward commit again. The newest watermark thus reaches Airflow at least once;
a restart repeats at most one event. The record is the only write and is idempotent: two
runs of the trigger record the same versions.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from time import monotonic
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from airflow_backfill.exceptions import BackfillConfigError

if TYPE_CHECKING:
    from airflow_backfill.hooks.delta import DeltaBackfillHook, WatermarkCommit

DEFAULT_POLL_INTERVAL = 2.0
"""Seconds between two reads of an MV's log (one file status each while nothing changed)."""
DEFAULT_MIN_INTERVAL = 10.0
"""Seconds at least between two events of one MV: an MV that commits every second starts a
downstream DAG run at most every ten seconds, with the newest watermark."""
STATE_KEY = "airflow_backfill.event_mv_version"
"""The asset state store's key for the MV version of the newest event sent."""
MAX_BACKOFF = 60.0
"""Seconds at most between two reads while the log cannot be read."""


def configured_intervals() -> tuple[float, float]:
    """The watchers' `poll_interval` and `min_interval` from the provider's settings
    (`asset_event_poll_interval`, `asset_event_min_interval`). Settings, not arguments of
    `mv_asset`: every DAG file that names the MV must build the same watcher, or the
    DAG processor swaps one for the other at each parse (docs/airflow.md)."""
    from airflow_backfill.config import setting

    intervals = []
    for name, default, least in (("asset_event_poll_interval", DEFAULT_POLL_INTERVAL, "above 0"),
                                 ("asset_event_min_interval", DEFAULT_MIN_INTERVAL, "0 or more")):
        text = setting(name) or str(default)
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not _seconds(value) or (least == "above 0" and value == 0):
            raise BackfillConfigError(f"[airflow_backfill] {name} (AIRFLOW_BACKFILL_{name.upper()}) must be a number "
                                      f"of seconds {least}, got {text!r}.")
        intervals.append(value)
    return intervals[0], intervals[1]


class MvCommitsTrigger(BaseEventTrigger):
    """Fires, for as long as it runs, one event per newest forward commit of the MV that
    moved its watermark (coalesced, see the module). It never ends: a watcher whose
    trigger ends is started again at once. Errors are logged and the read retried with a
    back-off, so an MV deleted and rebuilt is followed again.

    :param job: the job's name (the events' `airflow_backfill.job`).
    :param source: the upstream's URI, or for a join each upstream's URI by name.
    :param target: the MV's URI.
    :param app_id: the job's app transaction (`airflow_backfill/<job>`).
    :param poll_interval: seconds between two reads of the MV's log.
    :param min_interval: seconds at least between two events.
    :param aws_conn_id: the job's `aws` connection, for tables on S3 (read in the triggerer).
    """

    def __init__(
        self,
        job: str,
        source: str | dict[str, str],
        target: str,
        app_id: str,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        min_interval: float = DEFAULT_MIN_INTERVAL,
        aws_conn_id: str | None = None,
    ) -> None:
        super().__init__()
        if not _seconds(poll_interval) or poll_interval == 0:
            raise BackfillConfigError(f"the MV watcher's poll_interval must be seconds above 0, got {poll_interval!r}.")
        if not _seconds(min_interval):
            raise BackfillConfigError(f"the MV watcher's min_interval must be seconds, 0 or more, got {min_interval!r}.")
        self.job = job
        self.source = source
        self.target = target
        self.app_id = app_id
        self.poll_interval = poll_interval
        self.min_interval = min_interval
        self.aws_conn_id = aws_conn_id

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "job": self.job,
                "source": self.source,
                "target": self.target,
                "app_id": self.app_id,
                "poll_interval": self.poll_interval,
                "min_interval": self.min_interval,
                "aws_conn_id": self.aws_conn_id,
            },
        )

    def hook(self) -> DeltaBackfillHook:
        from airflow_backfill.hooks.delta import DeltaBackfillHook

        return DeltaBackfillHook(self.source, self.target, self.app_id, self.aws_conn_id)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = self.hook()
        previous = await self._recorded_version()
        self.log.info("watching the commits of MV %s (a read every %s s, events at least %s s apart); the "
                      "recorded event's MV version: %s", self.target, self.poll_interval, self.min_interval, previous)
        after, watermark = previous, None
        pending: list[WatermarkCommit] = []
        last_event = -math.inf
        unrecorded: int | None = None
        failures = 0
        while True:
            try:
                scan = await asyncio.to_thread(hook.watermark_commits, after, watermark)
                if scan is None or scan.restarted:  # no MV, a first read, or the MV was rebuilt
                    previous, pending = None, []
                after, watermark = (None, None) if scan is None else (scan.newest, scan.watermark)
                pending.extend(() if scan is None else scan.moved)
                event = None
                if pending and monotonic() - last_event >= self.min_interval:
                    event = await asyncio.to_thread(self._payload, hook, pending, previous)
                failures = 0
            except Exception as error:  # noqa: BLE001 - a watcher never ends: log, back off, read again
                failures += 1
                self.log.warning("reading the commits of MV %s failed (%s in a row): %s: %s",
                                 self.target, failures, type(error).__name__, error)
                await asyncio.sleep(min(MAX_BACKOFF, self.poll_interval * 2 ** failures))
                continue
            if event is not None:
                yield TriggerEvent(event)
                previous = unrecorded = pending[-1].version
                pending = []
                last_event = monotonic()
            await asyncio.sleep(self.poll_interval)
            if unrecorded is not None:
                await self._record(unrecorded)
                unrecorded = None

    def _payload(self, hook: DeltaBackfillHook, pending: list[WatermarkCommit], previous: int | None
                 ) -> dict[str, Any]:
        """The event for the newest of the `pending` commits (blocking: reads the logs)."""
        from airflow_backfill.asset_events import (
            COMMITS,
            COMMITTED_AT,
            MV_VERSION,
            PREVIOUS_MV_VERSION,
            event_extra,
        )

        newest = pending[-1]
        extra = event_extra(hook, job=self.job, phase=newest.phase or "forward", watermark=newest.watermark,
                            version=newest.version)
        extra.setdefault(MV_VERSION, newest.version)
        return {**extra, COMMITS: len(pending), PREVIOUS_MV_VERSION: previous, COMMITTED_AT: newest.committed_at}

    async def _recorded_version(self) -> int | None:
        """The MV version of the newest event a run of this trigger sent (the asset's state
        store, which the triggerer gives watchers); None when none is recorded or readable."""
        store = getattr(self, "asset_state_store", None)
        if store is None:
            return None
        try:
            value = await store.aget(STATE_KEY)
        except Exception as error:  # noqa: BLE001 - without the record the newest commit is sent again
            self.log.warning("the asset state store of MV %s cannot be read (%s); its newest forward commit "
                             "is sent again", self.target, error)
            return None
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    async def _record(self, version: int) -> None:
        store = getattr(self, "asset_state_store", None)
        if store is None:
            return
        try:
            await store.aset(STATE_KEY, version)
        except Exception as error:  # noqa: BLE001 - a restart then sends the newest commit again
            self.log.warning("recording the event of MV %s version %s failed: %s", self.target, version, error)



def _seconds(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
