"""Keep a phase's read throughput under the job's rows-per-second cap."""

from __future__ import annotations

import logging
import time

log = logging.getLogger(__name__)


def pace(rows: int, elapsed: float, rate_limit: int | None, sleep=time.sleep) -> float:
    """Sleep so that `rows` over the whole round take at least rows / rate_limit seconds."""
    if not rate_limit or rows <= 0:
        return 0.0
    wait = rows / rate_limit - elapsed
    if wait > 0:
        log.info("rate limit %s rows/s: pausing %.2fs", rate_limit, wait)
        sleep(wait)
        return wait
    return 0.0
