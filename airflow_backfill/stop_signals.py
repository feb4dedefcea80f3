"""Signals that ask a long-running loop to stop, without deadlocking it.

A Python signal handler runs in the main thread wherever that thread was interrupted,
including while it holds the lock inside `threading.Event.wait` or a log handler's stream.
Setting the event (or logging) from the handler itself can then wait on a lock the
interrupted thread never gets back to release: the process no longer stops. The handler
here only starts a short thread, which takes those locks once the main thread lets go.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterable
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def request_stop_on(stop: threading.Event, signals: Iterable[signal.Signals] = STOP_SIGNALS,
                    on_request: Callable[[int], None] | None = None) -> dict[int, Any]:
    """Make `signals` set `stop` (after calling `on_request(signum)`); the handlers they
    replace, for a caller that restores them."""

    def stop_now(signum: int) -> None:
        if on_request is not None:
            on_request(signum)
        stop.set()

    def handle(signum: int, _frame: object) -> None:
        threading.Thread(target=stop_now, args=(signum,), name="stop-request", daemon=True).start()

    return {signum: signal.signal(signum, handle) for signum in signals}
