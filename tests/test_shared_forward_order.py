"""Which members the shared forward hands to its workers: no more than the free workers,
the longest-waiting first, and an MV over another member's MV first once that MV has
committed since its own last round started (no Spark: the rounds are not run)."""

from __future__ import annotations

from concurrent.futures import Future

from airflow_backfill.shared_forward.loop import MemberStatus, SharedForward


class Member:
    kind = "delta"

    def __init__(self, name: str, sources: tuple[str, ...] = ()) -> None:
        self.name = name
        self.target = f"/lake/{name}"
        self.sources = sources

    def needs_backfill(self) -> bool:
        """Every MV is built: the loop hands out forward rounds only."""
        return False

    def close(self) -> None:
        """Nothing held."""


class Pool:
    """Records what is submitted; the rounds stay in flight."""

    def __init__(self) -> None:
        self.handed: list[str] = []

    def submit(self, step, status: MemberStatus) -> Future:
        self.handed.append(status.member.name)
        return Future()


def loop_with(statuses: dict[str, MemberStatus], workers: int) -> SharedForward:
    loop = SharedForward(None, lambda: None, workers=workers)  # type: ignore[arg-type]  # no round runs
    loop.members = statuses
    return loop


def test_no_more_than_the_free_workers_longest_waiting_first():
    statuses = {name: MemberStatus(Member(name), started=started)
                for name, started in (("a", 5.0), ("b", 1.0), ("c", 3.0), ("d", 2.0))}
    statuses["e"] = MemberStatus(Member("e"), started=0.0, next_check=11.0)  # polled idle: not due yet
    pool = Pool()
    loop_with(statuses, workers=3).dispatch(pool, now=10.0)  # type: ignore[arg-type]
    assert pool.handed == ["b", "d", "c"]
    assert statuses["b"].started == 10.0 and statuses["a"].started == 5.0
    more = Pool()
    loop_with(statuses, workers=3).dispatch(more, now=10.1)  # type: ignore[arg-type]
    assert more.handed == []  # every worker busy


def test_an_mv_over_an_mv_goes_first_once_its_source_committed():
    plain = MemberStatus(Member("plain"), started=8.0, committed=9.5)
    over = MemberStatus(Member("over", sources=("/lake/plain",)), started=9.0)
    other = MemberStatus(Member("other", sources=("/lake/upstream",)), started=1.0)
    pool = Pool()
    loop_with({"other": other, "plain": plain, "over": over}, workers=1).dispatch(pool, now=10.0)  # type: ignore[arg-type]
    assert pool.handed == ["over"]

    waited = MemberStatus(Member("over", sources=("/lake/plain",)), started=9.6)  # started after the commit
    pool = Pool()
    loop_with({"other": other, "plain": plain, "over": waited}, workers=1).dispatch(pool, now=10.0)  # type: ignore[arg-type]
    assert pool.handed == ["other"]
