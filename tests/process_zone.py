"""This test process's local time in another zone for a while."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def python_in_zone(zone: str) -> Iterator[None]:
    """Python's local time in `zone` (the JVM's stays what the engine set: UTC)."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = zone
    time.tzset()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TZ")
        else:
            os.environ["TZ"] = before
        time.tzset()
