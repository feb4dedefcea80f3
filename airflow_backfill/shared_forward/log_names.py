"""Name the member in every log line of its turn: fifty MVs share one log.

The engine's lines ("forward: applied epochs 101..125 ...") name no MV, which is enough
for a task that keeps one. In the shared forward each line written during a member's turn
(by the worker thread, and by the threads its round starts, which inherit the turn's
context) starts with the member's name in brackets: `[orders_by_status] forward: applied
epochs ...`.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Iterator
from contextlib import contextmanager

_MEMBER: contextvars.ContextVar[str | None] = contextvars.ContextVar("shared_forward_member", default=None)


@contextmanager
def member_turn(name: str) -> Iterator[None]:
    """Lines logged in the block (and in threads started with its context) name `name`."""
    token = _MEMBER.set(name)
    try:
        yield
    finally:
        _MEMBER.reset(token)


class MemberNames(logging.Filter):
    """Prefixes a record logged during a member's turn with the member's name, once."""

    def filter(self, record: logging.LogRecord) -> bool:
        name = _MEMBER.get()
        if name is not None and not getattr(record, "shared_forward_member", None):
            record.shared_forward_member = name
            record.msg = f"[{name.replace('%', '%%') if record.args else name}] {record.msg}"
        return True


@contextmanager
def naming_members(logger: logging.Logger | None = None) -> Iterator[None]:
    """`MemberNames` on every handler of `logger` (the root logger) for the block: a
    handler's filter sees the records of every logger below it."""
    handlers = list((logger or logging.getLogger()).handlers)
    names = MemberNames()
    for handler in handlers:
        handler.addFilter(names)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(names)
