"""A trigger that waits, in the triggerer, until an MV is within N epochs of its upstream.

It polls only the two Delta logs (delta-rs, no Spark) in a worker thread so the event
loop is never blocked, and serializes to plain values so the triggerer can rebuild it.
Its deadline is an absolute time, serialized with it: a triggerer that restarts (or a
second triggerer that picks the trigger up) keeps the sensor's original deadline
instead of starting the wait over.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_backfill.exceptions import BackfillError
from airflow_backfill.hooks.delta import DeltaBackfillHook
from airflow_backfill.triggers import DEFAULT_POLL_INTERVAL

MAX_TRANSIENT_FAILURES = 3
"""Consecutive failed reads (I/O errors, a log being rewritten) before the trigger gives up."""


class CaughtUpTrigger(BaseTrigger):
    """Fires once pending epochs <= `lag_threshold`: a single event with `status`
    `success`, `timeout` (the deadline passed) or `error` (the tables cannot be read).

    Pending epochs are counted against `reference_version` when given (the upstream
    version at which catch-up handed over), else against the upstream's latest version.

    :param deadline: a POSIX timestamp (seconds) after which the trigger reports
        `timeout`; None waits without a deadline.
    """

    def __init__(
        self,
        source: str,
        target: str,
        app_id: str,
        lag_threshold: int,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        reference_version: int | None = None,
        deadline: float | None = None,
    ) -> None:
        super().__init__()
        self.source = source
        self.target = target
        self.app_id = app_id
        self.lag_threshold = lag_threshold
        self.poll_interval = poll_interval
        self.reference_version = reference_version
        self.deadline = deadline

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
                "deadline": self.deadline,
            },
        )

    def _event(self, status: str, message: str, lag: Any = None) -> TriggerEvent:
        payload: dict[str, Any] = {"status": status, "message": message}
        if lag is not None:
            payload.update(watermark=lag.watermark, upstream_version=lag.upstream_version,
                           pending_epochs=lag.pending_epochs)
        return TriggerEvent(payload)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = DeltaBackfillHook(self.source, self.target, self.app_id)
        failures = 0
        while True:
            try:
                lag = await asyncio.to_thread(hook.lag, self.reference_version)
            except BackfillError as error:  # the tables themselves are wrong: waiting cannot help
                yield self._event("error", f"cannot read the lag of MV {self.target}: {error}")
                return
            except Exception as error:  # noqa: BLE001 - an I/O hiccup; retried a few times
                failures += 1
                self.log.warning("reading the lag of MV %s failed (%s of %s): %s",
                                 self.target, failures, MAX_TRANSIENT_FAILURES, error)
                if failures >= MAX_TRANSIENT_FAILURES:
                    yield self._event("error", f"cannot read the lag of MV {self.target} "
                                               f"({failures} attempts): {type(error).__name__}: {error}")
                    return
            else:
                failures = 0
                pending = lag.pending_epochs
                self.log.debug("MV %s: watermark %s, upstream %s, pending epochs %s (threshold %s)",
                               self.target, lag.watermark, lag.upstream_version, pending, self.lag_threshold)
                if pending is not None and pending <= self.lag_threshold:
                    yield self._event("success", f"MV {self.target} caught up: watermark {lag.watermark}, "
                                                 f"pending epochs {pending}", lag)
                    return
                if self.deadline is not None and time.time() >= self.deadline:
                    yield self._event("timeout", f"MV {self.target} did not catch up before its deadline: "
                                                 f"watermark {lag.watermark}, upstream {lag.upstream_version}, "
                                                 f"pending epochs {pending} > {self.lag_threshold}", lag)
                    return
            await asyncio.sleep(self.poll_interval)
