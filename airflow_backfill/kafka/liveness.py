"""Which Kafka processes run right now: a heartbeat file per running source job or backfill.

The source job and the source backfill each hold their table's writer lock for their whole
run (only one of each at a time), and beside it keep `<table>/_airflow_backfill/<role>.json`
fresh: pid, host, since when, last beat. A reader on another process or host (the backfill
task deciding whether to start a source job, `kafka-status`, a source job waiting for its
backfill) calls a process running while its last beat is recent; a killed process stops
beating, so it reads as stopped within `STALE_AFTER_S` (at once on its own host, where its
pid is checked) without anyone cleaning up.
Reading needs no lock, so asking never disturbs the holder.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from airflow_backfill.engine.job_state import state_dir
from airflow_backfill.storage import files
from airflow_backfill.storage.uri import join

log = logging.getLogger(__name__)

SOURCE_JOB = "kafka_source"
BACKFILL = "kafka_backfill"
BEAT_INTERVAL_S = 5.0
STALE_AFTER_S = 20.0
"""A process whose last beat is older than this counts as stopped."""
BACKFILL_GRACE_S = 20.0
"""How long a source job bound to a backfill runs without one. Short: `airflow dags test`
may run the source job task first and alone, and a backfill that starts later starts a
source job beside itself anyway (operators/kafka.py)."""


@dataclass(frozen=True)
class Running:
    """A process that beats: who it is and since when it runs."""

    role: str
    pid: int
    host: str
    since: float
    beat: float

    def describe(self) -> str:
        started = time.strftime("%H:%M:%S", time.gmtime(self.since))
        return f"pid {self.pid} on {self.host}, running since {started} UTC"


def _path(uri: str, role: str) -> str:
    return join(state_dir(uri), f"{role}.json")


def running(uri: str, role: str, stale_after: float = STALE_AFTER_S, now: float | None = None) -> Running | None:
    """The `role` process of the table at `uri` if its last beat is recent, else None."""
    try:
        text = files.read_text(_path(uri, role))
    except OSError:
        return None
    if not text:
        return None
    try:
        data: dict[str, Any] = json.loads(text)
        found = Running(role, int(data["pid"]), str(data["host"]), float(data["since"]), float(data["beat"]))
    except (ValueError, KeyError, TypeError):
        return None
    current = time.time() if now is None else now
    if current - found.beat > stale_after or (found.host == socket.gethostname() and not _alive(found.pid)):
        return None
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


@contextmanager
def beating(uri: str, role: str, interval: float = BEAT_INTERVAL_S) -> Iterator[None]:
    """Keep the `role` heartbeat of `uri` fresh for the block (a daemon thread), then remove it."""
    path = _path(uri, role)
    since = time.time()
    stop = threading.Event()

    def beat() -> None:
        record = {"pid": os.getpid(), "host": socket.gethostname(), "since": since, "beat": time.time()}
        try:
            files.write_text(path, json.dumps(record))
        except OSError as error:  # a missed beat only delays what others see
            log.warning("could not write the %s heartbeat %s: %s", role, path, error)

    def loop() -> None:
        while not stop.wait(interval):
            beat()

    beat()
    thread = threading.Thread(target=loop, name=f"{role}-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=interval)
        try:
            files.remove(path)
        except OSError as error:
            log.warning("could not remove the %s heartbeat %s: %s", role, path, error)
