"""In which order the folder's MVs are backfilled: an MV over an MV after its source, a
join after all its upstreams, and the MVs others wait for first.

An MV's snapshot pins its source's latest version: started before the source MV is
created it would read a table with no watermark (or none at all). Its source being
another member, the member says when it is built; a source outside the folder that
is an MV still being created (its state file says `creating`) holds it back too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from airflow_backfill.engine import job_state
from airflow_backfill.shared_forward.members import Member


def waits_for(member: Member, by_target: Mapping[str, Member]) -> str | None:
    """The name of the source MV `member`'s backfill waits for, or None when it may start."""
    for source in member.sources:
        upstream = by_target.get(source)
        if upstream is not None and upstream is not member:
            if not upstream.is_created():
                return upstream.name
        elif job_state.read_state(source).get("state") not in (None, job_state.STATE_CREATED):
            return source
    return None


def chain_lengths(members: Iterable[Member]) -> dict[str, int]:
    """Per member, the longest chain of members over its MV (0: none reads it). A free
    backfill worker takes the longest first: its dependents wait for it."""
    listed = list(members)
    readers: dict[str, list[Member]] = {}
    for member in listed:
        for source in member.sources:
            readers.setdefault(source, []).append(member)
    lengths: dict[str, int] = {}

    def length(member: Member, seen: frozenset[str]) -> int:
        if member.name not in lengths:
            over = [reader for reader in readers.get(member.target, []) if reader.name not in seen]
            lengths[member.name] = max((1 + length(reader, seen | {reader.name}) for reader in over), default=0)
        return lengths[member.name]

    for member in listed:
        length(member, frozenset({member.name}))
    return lengths
