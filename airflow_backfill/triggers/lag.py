"""A trigger that waits, in the triggerer, until an MV is within N epochs of its upstream.

It polls only the two Delta logs (delta-rs, no Spark) in a worker thread so the event
loop is never blocked, and serializes to plain values so the triggerer can rebuild it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_backfill.hooks.delta import DeltaBackfillHook


class CaughtUpTrigger(BaseTrigger):
    """Fires `caught_up` once pending epochs <= `lag_threshold`, or `timeout` after `timeout` s.

    Pending epochs are counted against `reference_version` when given (the upstream
    version at which catch-up handed over), else against the upstream's latest version.
    """

    def __init__(
        self,
        source: str,
        target: str,
        app_id: str,
        lag_threshold: int,
        poll_interval: float = 1.0,
        reference_version: int | None = None,
        timeout: float | None = None,
    ) -> None:
        super().__init__()
        self.source = source
        self.target = target
        self.app_id = app_id
        self.lag_threshold = lag_threshold
        self.poll_interval = poll_interval
        self.reference_version = reference_version
        self.timeout = timeout

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "source": self.source,
                "target": self.target,
                "app_id": self.app_id,
                "lag_threshold": self.lag_threshold,
                "poll_interval": self.poll_interval,
                "reference_version": self.reference_version,
                "timeout": self.timeout,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = DeltaBackfillHook(self.source, self.target, self.app_id)
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while True:
            lag = await asyncio.to_thread(hook.lag, self.reference_version)
            pending = lag.pending_epochs
            self.log.info("MV %s: watermark %s, upstream %s, pending epochs %s (threshold %s)",
                          self.target, lag.watermark, lag.upstream_version, pending, self.lag_threshold)
            if pending is not None and pending <= self.lag_threshold:
                yield TriggerEvent({"status": "caught_up", "watermark": lag.watermark,
                                    "upstream_version": lag.upstream_version, "pending_epochs": pending})
                return
            if deadline is not None and time.monotonic() >= deadline:
                yield TriggerEvent({"status": "timeout", "watermark": lag.watermark,
                                    "upstream_version": lag.upstream_version, "pending_epochs": pending})
                return
            await asyncio.sleep(self.poll_interval)
