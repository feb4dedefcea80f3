"""Times the shared forward's checks that a round's added keys are held once in the upstream.

The engine logs where such a check ends (`rounds/key_check.py`), not where it starts.
Installed in the forward's driver by `bench/forward_probe/sitecustomize.py` before the
engine is imported, this wraps the check's entry points and logs one line per check into
the forward's own log, named by the MV like every line of its turn:

    bench key check: 5.412 s, upstream read

"upstream read" when Spark read the upstream (`refuse_keys_held_twice`), "driver lookup"
when the driver looked the keys up in the upstream's files (`refused_by_driver`), "no
upstream read" when neither did (the added keys all lay above the upstream's largest key). The
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
READS_UPSTREAM = {"refused_by_driver": "driver lookup", "refuse_keys_held_twice": "upstream read"}
"""The parts that read the upstream, and how (Spark's read, when it comes, comes last)."""
_state = threading.local()


def _outer(function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        _state.how = "no upstream read"
        started = time.monotonic()
        try:
            return function(*args, **kwargs)
        finally:
            log.info("%s%.3f s, %s", PROBE_LINE, time.monotonic() - started, _state.how)
    return timed


def _reads(function: Callable[..., Any], how: str) -> Callable[..., Any]:
    @functools.wraps(function)
    def marked(*args: Any, **kwargs: Any) -> Any:
        _state.how = how
        return function(*args, **kwargs)
    return marked


def install() -> None:
    """Wrap the entry points in `rounds/key_check.py` (module attributes: the callers
    import them by name after this runs)."""
    from airflow_backfill.engine.rounds import key_check

    for name, how in READS_UPSTREAM.items():
        if hasattr(key_check, name):
            setattr(key_check, name, _reads(getattr(key_check, name), how))
    for name in OUTER:
        if hasattr(key_check, name):
            setattr(key_check, name, _outer(getattr(key_check, name)))
