"""The point between a commit's files being written and the commit being made.

Every MV and state commit passes `reached()` there: the engine's own transactions once
their files are written (`transaction_write`), and Delta's own commands (MERGE, DELETE)
just before they run, since each writes its files and commits in one call. Callers hang
work on the point for the commits made in a block (`at_each_commit`); fault injection
kills the process there (`after_write`), so the crash tests leave exactly what a crash
between the two leaves: files no log entry names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_HOOKS: ContextVar[tuple[Callable[[], None], ...]] = ContextVar("commit_fence_hooks", default=())


@contextmanager
def at_each_commit(hook: Callable[[], None]) -> Iterator[None]:
    """Run `hook` at the fence of every commit made in the block (in this thread)."""
    token = _HOOKS.set((*_HOOKS.get(), hook))
    try:
        yield
    finally:
        _HOOKS.reset(token)


def reached() -> None:
    """A commit's files are written (or, for Delta's own commands, about to be) and the
    commit is not made yet."""
    for hook in _HOOKS.get():
        hook()
