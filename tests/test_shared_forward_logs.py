"""The shared forward's log names the member of each line written during its turn (fifty
MVs share one log), in the worker thread and in threads its round starts; lines outside a
turn are left as they are."""

from __future__ import annotations

import contextvars
import logging
import threading

from airflow_backfill.shared_forward.log_names import member_turn, naming_members
from airflow_backfill.shared_forward.loop import MemberStatus, SharedForward

log = logging.getLogger("airflow_backfill.engine.phases.apply")


class QuietMember:
    """A member with nothing pending, which logs while it is asked."""

    kind = "delta"
    sources: tuple[str, ...] = ()

    def __init__(self, name: str) -> None:
        self.name = name
        self.target = f"/lake/{name}"

    def waiting(self) -> str | None:
        log.info("forward: applied epochs %s..%s", 3, 4)
        return None

    def pending(self) -> bool:
        context = contextvars.copy_context()  # as the engine's commit_after starts its thread
        helper = threading.Thread(target=lambda: context.run(log.info, "state committed (100%)"))
        helper.start()
        helper.join()
        return False

    def run_round(self, spark) -> int:
        raise AssertionError("nothing is pending")

    def close(self) -> None:
        """Nothing held."""


def test_each_line_of_a_turn_starts_with_the_members_name(caplog):
    caplog.set_level(logging.INFO)
    loop = SharedForward(None, lambda: None)  # type: ignore[arg-type]  # no round runs: no session
    with naming_members():
        assert loop.step(MemberStatus(QuietMember("orders_%_by_day"))) == 0
        log.info("between turns")
    assert [record.getMessage() for record in caplog.records] == [
        "[orders_%_by_day] forward: applied epochs 3..4",
        "[orders_%_by_day] state committed (100%)",
        "between turns",
    ]


def test_names_are_added_once_and_only_while_naming(caplog):
    caplog.set_level(logging.INFO)
    with member_turn("outside"):
        log.info("not named: no filter installed")
    with naming_members(), naming_members(), member_turn("plain_1"):
        log.info("twice installed, %s prefix", "one")
    assert [record.getMessage() for record in caplog.records] == [
        "not named: no filter installed", "[plain_1] twice installed, one prefix"]
