"""An aggregate's state and MV written side by side, the MV committed after the state.

No reader may see the MV ahead of its state (a crash between the two commits is recovered
from the state), so the state commits first. The MV's files need not wait for that: written
while the state's files are written and committed, the two tables' Spark jobs and Delta's
commit work overlap (0.66 s -> 0.47 s for a round of TPC-H Q3's state and MV at SF 1,
docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

Written = TypeVar("Written")


def state_then_mv(write_state: Callable[[], object], write_mv: Callable[[Callable[[], None]], Written],
                  after_state_commit: Callable[[], None]) -> Written:
    """Run `write_state` in a thread of its own while `write_mv(before_commit)` writes the
    MV's files; the MV's `before_commit` waits for the state's commit, then runs
    `after_state_commit`. An error of the state's write is raised from the MV's
    `before_commit`, so the MV does not commit; returns what `write_mv` returns."""
    from pyspark import InheritableThread

    failed: list[BaseException] = []

    def state_thread() -> None:
        try:
            write_state()
        except BaseException as error:  # raised again in this thread, where the MV's write waits
            failed.append(error)

    writer = InheritableThread(target=state_thread, name="state-write")
    writer.start()

    def state_committed() -> None:
        writer.join()
        if failed:
            raise failed[0]
        after_state_commit()

    try:
        written = write_mv(state_committed)
    finally:
        writer.join()
    if failed:  # the MV had its version already, so its write never waited
        raise failed[0]
    return written
