"""What a users' writer commits next: the kind of commit, its rows' keys, its size.

Users' writers do not only append ascending keys: they update and delete scattered rows,
re-insert keys they deleted earlier (CDC replays, undo) and upsert batches in which some
keys exist and some are new. A commit holds 1 - 500 rows, most of them few (log-uniform:
median about 22). The plan is a pure function of a seeded `random.Random` and the
writer's `KeyBook`, so a seed fixes the whole history; the book changes only once the
commit landed (`KeyBook.apply`), so a retried commit is the same commit.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

APPEND, UPDATE, DELETE, REINSERT, UPSERT = "append", "update", "delete", "reinsert", "upsert"
KINDS = (APPEND, UPDATE, DELETE, REINSERT, UPSERT)
WEIGHTS = {APPEND: 0.25, UPDATE: 0.25, DELETE: 0.15, REINSERT: 0.10, UPSERT: 0.25}
"""How often each kind is drawn (a re-insert with no deleted key becomes an append)."""
MAX_ROWS = 500
MIN_LIVE_ROWS = 10
"""Deletes never take a table below this many rows."""


@dataclass
class KeyBook:
    """The keys a table holds, as row indices: every index below `next_index` except the
    deleted ones. Indices map one to one onto primary keys (`user_tables`)."""

    next_index: int
    deleted: set[int] = field(default_factory=set)

    @property
    def live(self) -> int:
        return self.next_index - len(self.deleted)

    @classmethod
    def from_indices(cls, indices: list[int]) -> KeyBook:
        """The book of a table whose rows have these indices (read back from the table)."""
        held = set(indices)
        if len(held) != len(indices):
            raise ValueError("the table holds a key more than once")
        top = max(held, default=-1) + 1
        return cls(top, set(range(top)) - held)

    def apply(self, plan: CommitPlan) -> None:
        """Record a commit that landed."""
        self.deleted -= set(plan.inserted)
        self.deleted |= set(plan.deleted)
        self.next_index = max([self.next_index, *(index + 1 for index in plan.inserted)])


@dataclass(frozen=True)
class CommitPlan:
    """One commit: its kind and the indices whose rows it inserts, updates or deletes (an
    upsert's `updated` keys exist, its `inserted` ones do not)."""

    kind: str
    inserted: tuple[int, ...] = ()
    updated: tuple[int, ...] = ()
    deleted: tuple[int, ...] = ()

    @property
    def rows(self) -> int:
        return len(self.inserted) + len(self.updated) + len(self.deleted)


def commit_size(rng: random.Random) -> int:
    """1 - MAX_ROWS rows, log-uniform: most commits small, a few large."""
    return max(1, min(MAX_ROWS, int(math.exp(rng.random() * math.log(MAX_ROWS + 1)))))


def sample_live(rng: random.Random, book: KeyBook, count: int) -> list[int]:
    """`count` distinct held indices, scattered over the whole key range."""
    count = min(count, book.live)
    chosen: set[int] = set()
    while len(chosen) < count:
        index = rng.randrange(book.next_index)
        if index not in book.deleted:
            chosen.add(index)
    return sorted(chosen)


def sample_deleted(rng: random.Random, book: KeyBook, count: int) -> list[int]:
    return sorted(rng.sample(sorted(book.deleted), min(count, len(book.deleted))))


def fresh(book: KeyBook, count: int) -> list[int]:
    return list(range(book.next_index, book.next_index + count))


def plan_commit(rng: random.Random, book: KeyBook) -> CommitPlan:
    """The next commit of a table whose keys are `book`."""
    kind = rng.choices(KINDS, weights=[WEIGHTS[kind] for kind in KINDS])[0]
    size = commit_size(rng)
    if kind == REINSERT and not book.deleted:
        kind = APPEND
    if kind in (UPDATE, DELETE, UPSERT) and book.live <= MIN_LIVE_ROWS:
        kind = APPEND
    if kind == APPEND:
        return CommitPlan(APPEND, inserted=tuple(fresh(book, size)))
    if kind == REINSERT:
        return CommitPlan(REINSERT, inserted=tuple(sample_deleted(rng, book, size)))
    if kind == UPDATE:
        return CommitPlan(UPDATE, updated=tuple(sample_live(rng, book, size)))
    if kind == DELETE:
        return CommitPlan(DELETE, deleted=tuple(sample_live(rng, book, min(size, book.live - MIN_LIVE_ROWS))))
    matched = sample_live(rng, book, max(1, round(size * rng.uniform(0.3, 0.9))))
    missing = size - len(matched)
    again = sample_deleted(rng, book, rng.randint(0, missing))
    return CommitPlan(UPSERT, inserted=tuple(again + fresh(book, missing - len(again))), updated=tuple(matched))
