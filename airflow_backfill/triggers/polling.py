"""What the provider's triggers share: poll a blocking check in a worker thread (the
triggerer's event loop serves many triggers and must never block) until it is met, the
absolute deadline passes, or the check keeps failing; then fire exactly one event with
`status` `success`, `timeout` or `error`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_backfill.exceptions import BackfillError, UnreachableError

MAX_TRANSIENT_FAILURES = 3
"""Consecutive failed checks (I/O errors, a log being rewritten) before a trigger gives up."""


@dataclass(frozen=True)
class Poll:
    """One check's outcome: whether the wait is over, and what the event reports."""

    done: bool
    message: str
    """Said in the success event (`done`) or the timeout event (not `done`)."""
    facts: dict[str, Any] = field(default_factory=dict)
    """Plain values added to the event's payload."""


class PollingTrigger(BaseTrigger):
    """Base of the provider's triggers. Subclasses implement `check` (blocking, run in a
    thread), `subject` (what is read, for error messages) and `serialize`.

    :param poll_interval: seconds between two checks.
    :param deadline: a POSIX timestamp (seconds) after which the trigger reports
        `timeout`; None waits without a deadline. Absolute and serialized, so a
        restarted triggerer keeps the sensor's original deadline.
    """

    def __init__(self, poll_interval: float, deadline: float | None) -> None:
        super().__init__()
        self.poll_interval = poll_interval
        self.deadline = deadline

    @property
    def subject(self) -> str:
        raise NotImplementedError

    def check(self) -> Poll:
        raise NotImplementedError

    @staticmethod
    def _event(status: str, message: str, facts: dict[str, Any] | None = None) -> TriggerEvent:
        return TriggerEvent({"status": status, "message": message, **(facts or {})})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        failures = 0
        while True:
            try:
                poll = await asyncio.to_thread(self.check)
            except Exception as error:  # noqa: BLE001 - I/O hiccups and unreachable stores: retried a few times
                if isinstance(error, BackfillError) and not isinstance(error, UnreachableError):
                    # the tables, the job or the credentials are wrong: waiting cannot help
                    yield self._event("error", f"cannot read {self.subject}: {error}")
                    return
                failures += 1
                self.log.warning("reading %s failed (%s of %s): %s",
                                 self.subject, failures, MAX_TRANSIENT_FAILURES, error)
                if failures >= MAX_TRANSIENT_FAILURES:
                    yield self._event("error", f"cannot read {self.subject} "
                                               f"({failures} attempts): {type(error).__name__}: {error}")
                    return
            else:
                failures = 0
                self.log.debug("%s: done=%s %s", self.subject, poll.done, poll.facts)
                if poll.done:
                    yield self._event("success", poll.message, poll.facts)
                    return
                if self.deadline is not None and time.time() >= self.deadline:
                    yield self._event("timeout", poll.message, poll.facts)
                    return
            await asyncio.sleep(self.poll_interval)
