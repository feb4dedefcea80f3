"""The MV's writer lock as the shared forward takes it: for one turn, never for a member's life.

A turn that finds the lock held by another process (a per-job DAG's phase task, a
single-MV forward, a catch-up started by hand) raises `LockBusy`: the member waits for
the next poll instead of failing, and the other process's work is never interleaved
with its own.
"""

from __future__ import annotations

from contextlib import ExitStack

from airflow_backfill.engine.writer_lock import writer_lock
from airflow_backfill.exceptions import WriterBusyError


class LockBusy(Exception):
    """Another process (a catch-up, a single-MV forward) holds the MV's writer lock."""


def locked(target: str, name: str, phase: str) -> ExitStack:
    """The MV's writer lock for one turn, or LockBusy."""
    stack = ExitStack()
    try:
        stack.enter_context(writer_lock(target, name, phase))
    except WriterBusyError as error:
        stack.close()
        raise LockBusy(str(error)) from None
    return stack
