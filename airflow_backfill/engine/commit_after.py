"""A write whose commit waits for other work, that work run beside the write's files.

Why: an aggregate's MV must not commit before its state (a crash between the two commits
is recovered from the state), and a recompute must not commit before the upstream's key
is proved unique. Neither has to wait before the MV's files are written: in a thread of
its own, the other work overlaps the write's Spark jobs (a round of TPC-H Q3's state and
MV at SF 1: 0.66 s one after the other, 0.47 s side by side; docs/benchmarks.md).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import TypeVar

Written = TypeVar("Written")


def commit_after(first: Callable[[], object], write: Callable[[Callable[[], None]], Written],
                 after_first: Callable[[], None] | None = None) -> Written:
    """Run `first` in a thread of its own while `write(before_commit)` writes its files; the
    write's `before_commit` waits for `first`, then runs `after_first`. An error of `first`
    is raised from `before_commit`, so the write does not commit; returns what `write`
    returns."""
    from pyspark import InheritableThread

    failed: list[BaseException] = []

    def first_thread() -> None:
        try:
            first()
        except BaseException as error:  # raised again in this thread, where the write waits
            failed.append(error)

    context = contextvars.copy_context()  # the commit fence's hooks (`delta/commit_fence`) reach `first` too
    worker = InheritableThread(target=lambda: context.run(first_thread), name="before-commit")
    worker.start()

    def first_done() -> None:
        worker.join()
        if failed:
            raise failed[0]
        if after_first is not None:
            after_first()

    try:
        written = write(first_done)
    finally:
        worker.join()
    if failed:  # the write had nothing to commit (its version was there), so it never waited
        raise failed[0]
    return written
