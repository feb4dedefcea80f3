"""Times the shared forward's checks that a round's added keys are held once in the upstream.

The engine logs where such a check ends (`phases/repeated_keys.py`), not where it starts.
Installed in the forward's driver by `bench/forward_probe/sitecustomize.py` before the
engine is imported, this wraps the check's entry points and logs one line per check into
the forward's own log, named by the MV like every line of its turn:

    bench key check: 5.412 s, upstream read

"upstream read" when the check read the upstream (`refuse_keys_held_twice`), "no upstream
read" when it did not (the added keys all lay above the upstream's largest key). The
engine's behaviour is untouched; an entry point the engine no longer has is skipped.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("bench.key_check_probe")

PROBE_LINE = "bench key check: "
OUTER = ("refuse_arrived_keys_held_twice", "refuse_repeated_appended_keys")
"""The checks a round calls (each may or may not read the upstream)."""
READS_UPSTREAM = "refuse_keys_held_twice"
"""The part that reads the upstream."""
_state = threading.local()


def _outer(function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        _state.read = False
        started = time.monotonic()
        try:
            return function(*args, **kwargs)
        finally:
            log.info("%s%.3f s, %s", PROBE_LINE, time.monotonic() - started,
                     "upstream read" if _state.read else "no upstream read")
    return timed


def _reads(function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def marked(*args: Any, **kwargs: Any) -> Any:
        _state.read = True
        return function(*args, **kwargs)
    return marked


def install() -> None:
    """Wrap the entry points in `phases/repeated_keys.py` (module attributes: the callers
    import them by name after this runs)."""
    from airflow_backfill.engine.phases import repeated_keys

    if hasattr(repeated_keys, READS_UPSTREAM):
        setattr(repeated_keys, READS_UPSTREAM, _reads(getattr(repeated_keys, READS_UPSTREAM)))
    for name in OUTER:
        if hasattr(repeated_keys, name):
            setattr(repeated_keys, name, _outer(getattr(repeated_keys, name)))
