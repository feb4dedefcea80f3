"""One writer per MV: an exclusive lock held for the whole of a phase.

Locally the lock is an `flock` on `<target>/_airflow_backfill/writer.lock`. The kernel
drops it when the holder exits, however it exits (SIGKILL included), so a crashed run
never leaves a stale lock behind. On S3 it is a lease taken with a conditional write
(storage/lease.py), which a crashed holder stops renewing. Either way a second run of
the same job fails at once with the holder's details instead of interleaving commits
with it.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

from airflow_backfill.engine.job_state import state_dir
from airflow_backfill.exceptions import WriterBusyError
from airflow_backfill.storage.lease import s3_writer_lease
from airflow_backfill.storage.uri import is_object_store, join

LOCK_FILE = "writer.lock"
LEASE_FILE = "writer.lease"

log = logging.getLogger(__name__)


@contextmanager
def writer_lock(target: str, job_name: str, phase: str) -> Iterator[None]:
    """Hold the MV's writer lock for the block, or raise WriterBusyError naming the holder."""
    if is_object_store(target):
        with s3_writer_lease(join(state_dir(target), LEASE_FILE), target, job_name, phase):
            yield
        return
    directory = state_dir(target)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, LOCK_FILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            raise WriterBusyError(
                f"another run of job {job_name} is writing the MV {target} ({holder}); only one "
                "run may write an MV at a time. Wait for it to finish or stop it, then retry."
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({
            "phase": phase, "pid": os.getpid(), "host": socket.gethostname(), "since": time.time(),
        }).encode(), 0)
        log.info("holding the writer lock of %s for the %s phase", target, phase)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock


def _read_holder(fd: int) -> str:
    try:
        holder = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        return "holder unknown"
    if not holder:
        return "holder unknown"
    return f"{holder.get('phase')} phase, pid {holder.get('pid')} on {holder.get('host')}"
