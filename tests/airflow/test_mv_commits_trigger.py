"""The MV's watcher (`MvCommitsTrigger`): its serialization, and the events it fires while
MV commits land between its reads of a real (hand-built) Delta MV: one per newest forward
commit that moved the watermark, coalesced under `min_interval`, none for the commits that
do not move it, and at least once for the newest watermark across restarts.

The trigger's sleeps and clock are replaced by a scripted one: each sleep between two
reads runs the next step of the scenario (the commits made meanwhile) and advances the
clock by the seconds asked, so every read sees exactly what a step wrote."""

from __future__ import annotations

import asyncio
import importlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from consistency_tables import foreign_write, mv_commit, rows_unchanged, upstream
from deltalake import DeltaTable

from airflow_backfill.asset_events import mv_event_fields
from airflow_backfill.exceptions import BackfillConfigError
from airflow_backfill.triggers import mv_commits
from airflow_backfill.triggers.mv_commits import STATE_KEY, MvCommitsTrigger, configured_intervals

JOB = "orders_mv"
APP_ID = f"airflow_backfill/{JOB}"
_real_sleep = asyncio.sleep


class Stop(Exception):
    """Ends a scripted run once its steps are done."""


class Script:
    """The trigger's clock and sleeps: each sleep runs the next step, then advances the clock."""

    def __init__(self, steps: Sequence[Callable[[], object] | None]) -> None:
        self.steps = list(steps)
        self.now = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        if not self.steps:
            raise Stop
        step = self.steps.pop(0)
        if step is not None:
            step()
        self.now += seconds
        await _real_sleep(0)


class MemoryStateStore:
    """The asset state store the triggerer gives a watcher (`aget`/`aset`), in memory."""

    def __init__(self, values: dict[str, Any] | None = None, failing: bool = False) -> None:
        self.values = dict(values or {})
        self.failing = failing

    async def aget(self, key: str, default: Any = None) -> Any:
        if self.failing:
            raise ConnectionError("the API server does not answer")
        return self.values.get(key, default)

    async def aset(self, key: str, value: Any) -> None:
        if self.failing:
            raise ConnectionError("the API server does not answer")
        self.values[key] = value


def run_script(trigger: MvCommitsTrigger, steps: Sequence[Callable[[], object] | None], monkeypatch,
               store: MemoryStateStore | None = None) -> list[dict[str, Any]]:
    """The payloads the trigger fires while the steps run, one step between two reads."""
    return play(trigger, Script(steps), monkeypatch, store)


def play(trigger: MvCommitsTrigger, script: Script, monkeypatch, store: MemoryStateStore | None = None
         ) -> list[dict[str, Any]]:
    monkeypatch.setattr(mv_commits.asyncio, "sleep", script.sleep)
    monkeypatch.setattr(mv_commits, "monotonic", script.monotonic)
    trigger.asset_state_store = store  # what the triggerer injects into a watcher
    events: list[dict[str, Any]] = []

    async def collect() -> None:
        try:
            async for event in trigger.run():
                events.append(event.payload)
        except Stop:
            return

    asyncio.run(asyncio.wait_for(collect(), timeout=60))
    return events


@pytest.fixture
def lake(tmp_path: Path) -> dict[str, str]:
    """An upstream with versions 0..9 and the path of its MV (not created)."""
    return {"source": upstream(str(tmp_path / "orders"), 10), "target": str(tmp_path / "orders_mv")}


def trigger_for(lake: dict[str, str], **kwargs: Any) -> MvCommitsTrigger:
    kwargs = {"poll_interval": 1.0, "min_interval": 0.0, **kwargs}
    return MvCommitsTrigger(job=JOB, source=lake["source"], target=lake["target"], app_id=APP_ID, **kwargs)


def commit(lake: dict[str, str], *watermarks: int, phase: str = "forward") -> Callable[[], list[int]]:
    """A step: MV commits at each watermark, by `phase`."""
    return lambda: [mv_commit(lake["target"], JOB, lake["source"], watermark, phase=phase) for watermark in watermarks]


def committed_at(target: str, version: int) -> int:
    return next(entry["timestamp"] for entry in DeltaTable(target).history() if entry["version"] == version)


def test_the_trigger_serializes_to_a_rebuildable_path_and_exact_kwargs():
    trigger = MvCommitsTrigger(job=JOB, source={"a": "s3://lake/a", "b": "s3://lake/b"}, target="s3://lake/mv",
                               app_id=APP_ID, poll_interval=3.5, min_interval=30.0, aws_conn_id="lake")
    path, kwargs = trigger.serialize()
    assert path == "airflow_backfill.triggers.mv_commits.MvCommitsTrigger"
    assert kwargs == {"job": JOB, "source": {"a": "s3://lake/a", "b": "s3://lake/b"}, "target": "s3://lake/mv",
                      "app_id": APP_ID, "poll_interval": 3.5, "min_interval": 30.0, "aws_conn_id": "lake"}
    json.dumps(kwargs)  # plain values: the DAG processor stores them, the triggerer rebuilds from them
    module, _, name = path.rpartition(".")
    rebuilt = getattr(importlib.import_module(module), name)(**kwargs)
    assert rebuilt.serialize() == (path, kwargs)


@pytest.mark.parametrize(("poll_interval", "min_interval"), [(0, 10), (-1, 10), (2, -1), (float("nan"), 10),
                                                             ("2", 10)])
def test_bad_intervals_are_refused(poll_interval, min_interval):
    with pytest.raises(BackfillConfigError, match="the MV watcher's"):
        MvCommitsTrigger(job=JOB, source="/s", target="/t", app_id=APP_ID, poll_interval=poll_interval,
                         min_interval=min_interval)


def test_the_intervals_come_from_the_providers_settings(monkeypatch):
    assert configured_intervals() == (mv_commits.DEFAULT_POLL_INTERVAL, mv_commits.DEFAULT_MIN_INTERVAL)
    monkeypatch.setenv("AIRFLOW_BACKFILL_ASSET_EVENT_POLL_INTERVAL", "5")
    monkeypatch.setenv("AIRFLOW_BACKFILL_ASSET_EVENT_MIN_INTERVAL", "0")
    assert configured_intervals() == (5.0, 0.0)
    monkeypatch.setenv("AIRFLOW_BACKFILL_ASSET_EVENT_POLL_INTERVAL", "0")
    with pytest.raises(BackfillConfigError, match=r"\[airflow_backfill\] asset_event_poll_interval"):
        configured_intervals()


def test_each_forward_commit_between_reads_fires_one_event_with_the_phase_tasks_extra(lake, monkeypatch):
    """At its start the watcher sends the newest forward commit (nothing recorded says it was
    sent); then one event per read that found a new commit, none for a read that did not."""
    target = lake["target"]
    commit(lake, 1, 2)()  # versions 0, 1
    events = run_script(trigger_for(lake), [commit(lake, 4), None, commit(lake, 5), None], monkeypatch)
    assert [(e["airflow_backfill.mv_version"], e["airflow_backfill.watermark"]) for e in events] == [
        (1, 2), (2, 4), (3, 5)]
    assert events[1] == {
        "airflow_backfill.job": JOB, "airflow_backfill.phase": "forward", "airflow_backfill.watermark": 4,
        "airflow_backfill.source": lake["source"], "airflow_backfill.mv_version": 2,
        "airflow_backfill.upstream_epochs": {lake["source"]: 4}, "airflow_backfill.feed_readers": None,
        "airflow_backfill.commits": 1, "airflow_backfill.previous_mv_version": 1,
        "airflow_backfill.committed_at": committed_at(target, 2),
    }
    assert events[0]["airflow_backfill.previous_mv_version"] is None  # the first after a start without record


def test_many_commits_are_coalesced_into_one_event_with_the_newest_watermark(lake, monkeypatch):
    commit(lake, 1)()  # version 0
    # min_interval 0: five commits within one read interval are one event.
    events = run_script(trigger_for(lake), [commit(lake, 2, 3, 4, 5, 6)], monkeypatch)
    assert [(e["airflow_backfill.watermark"], e["airflow_backfill.commits"]) for e in events] == [(1, 1), (6, 5)]
    assert events[1]["airflow_backfill.mv_version"] == 5 and events[1]["airflow_backfill.previous_mv_version"] == 0


def test_min_interval_holds_events_back_and_the_next_one_covers_every_commit_since(lake, monkeypatch):
    """Reads every second, an event every 10 s at most: commits in 1-second steps become one
    event per 10 s, each naming the newest watermark and the commits it covers."""
    commit(lake, 0)()  # version 0: the start's event
    steps = [commit(lake, watermark) for watermark in range(1, 10)] + [None, None]
    events = run_script(trigger_for(lake, min_interval=10.0), steps, monkeypatch)
    assert [(e["airflow_backfill.watermark"], e["airflow_backfill.commits"],
             e["airflow_backfill.previous_mv_version"]) for e in events] == [(0, 1, None), (9, 9, 0)]


def test_no_event_for_commits_that_do_not_move_the_watermark_or_that_a_task_reports(lake, monkeypatch):
    """A table property or compaction (no app transaction), a write by another writer, a
    commit that records the same watermark again, and a catch-up commit (its task's event
    reports it) fire nothing; the next forward commit fires one event covering only it."""
    target = lake["target"]
    steps = [
        commit(lake, 1, phase="snapshot"),  # the MV is created: the snapshot task reports it
        lambda: rows_unchanged(target),
        lambda: foreign_write(target),
        commit(lake, 1),  # the same watermark again
        commit(lake, 3, phase="catch_up"),
        None,
        commit(lake, 3),  # forward, but the watermark is already 3
        commit(lake, 4),
    ]
    events = run_script(trigger_for(lake), steps, monkeypatch)
    assert [(e["airflow_backfill.watermark"], e["airflow_backfill.commits"]) for e in events] == [(4, 1)]
    assert events[0]["airflow_backfill.mv_version"] == 6


def test_a_restarted_watcher_continues_after_the_event_it_recorded(lake, monkeypatch):
    """The event's MV version is recorded one read after the event: a restart after that
    sends nothing again (no duplicate), and the next commit's event follows on from it."""
    commit(lake, 1)()
    store = MemoryStateStore()
    first = trigger_for(lake)
    assert run_script(first, [None], monkeypatch, store) == [first_event(lake, 0, 1)]
    assert store.values == {STATE_KEY: 0}
    _, kwargs = first.serialize()
    assert run_script(MvCommitsTrigger(**kwargs), [None, None], monkeypatch, store) == []
    events = run_script(MvCommitsTrigger(**kwargs), [commit(lake, 3), None], monkeypatch, store)
    assert [(e["airflow_backfill.watermark"], e["airflow_backfill.previous_mv_version"]) for e in events] == [(3, 0)]
    assert store.values == {STATE_KEY: 1}


def test_a_watcher_stopped_before_recording_its_event_sends_it_again(lake, monkeypatch):
    """Stopped right after firing (the triggerer may not have stored the event yet): nothing
    was recorded, so the restarted watcher sends the newest watermark again: at least once."""
    commit(lake, 1)()
    store = MemoryStateStore()
    assert len(run_script(trigger_for(lake), [], monkeypatch, store)) == 1
    assert store.values == {}
    again = run_script(trigger_for(lake), [None], monkeypatch, store)
    assert [e["airflow_backfill.mv_version"] for e in again] == [0]


def test_without_a_readable_state_store_a_restart_repeats_only_the_newest_event(lake, monkeypatch):
    commit(lake, 1, 2, 3)()
    for store in (None, MemoryStateStore(failing=True)):
        events = run_script(trigger_for(lake), [None, None], monkeypatch, store)
        assert [(e["airflow_backfill.mv_version"], e["airflow_backfill.commits"]) for e in events] == [(2, 1)]


def test_an_mv_rebuilt_below_the_recorded_version_is_followed_again(lake, monkeypatch, tmp_path):
    """The record names version 7 of a table that was deleted and rebuilt: its log has no
    version 7, so the watcher starts over from the new table's newest forward commit."""
    commit(lake, 1)()
    store = MemoryStateStore({STATE_KEY: 7})
    events = run_script(trigger_for(lake), [None], monkeypatch, store)
    assert [(e["airflow_backfill.mv_version"], e["airflow_backfill.previous_mv_version"]) for e in events] == [
        (0, None)]


def test_no_mv_yet_fires_nothing_until_its_first_forward_commit(lake, monkeypatch):
    events = run_script(trigger_for(lake), [None, commit(lake, 2, phase="snapshot"), None, commit(lake, 5)],
                        monkeypatch)
    assert [(e["airflow_backfill.watermark"], e["airflow_backfill.mv_version"]) for e in events] == [(5, 1)]


def test_a_failing_read_is_logged_and_retried_with_a_back_off_and_never_ends_the_watcher(lake, monkeypatch, capsys):
    from airflow_backfill.hooks.delta import DeltaBackfillHook

    commit(lake, 1)()
    real = DeltaBackfillHook.watermark_commits
    failures = iter([OSError("the disk went away"), OSError("still away")])

    def flaky(self, after, watermark=None):
        error = next(failures, None)
        if error is not None:
            raise error
        return real(self, after, watermark)

    monkeypatch.setattr(DeltaBackfillHook, "watermark_commits", flaky)
    script = Script([None, None, commit(lake, 4), None])
    events = play(trigger_for(lake), script, monkeypatch)
    assert [e["airflow_backfill.watermark"] for e in events] == [1, 4]
    assert script.sleeps[:3] == [2.0, 4.0, 1.0]  # backed off twice, then the poll interval
    logged = capsys.readouterr().out
    assert "reading the commits of MV" in logged and "(2 in a row): OSError: still away" in logged


def test_a_join_event_names_each_upstreams_watermark_and_epoch(tmp_path, monkeypatch):
    a, b = upstream(str(tmp_path / "a"), 4), upstream(str(tmp_path / "b"), 3)
    target = str(tmp_path / "joined")
    sources = {"a": a, "b": b}
    mv_commit(target, JOB, sources, vector={"a": 3, "b": 2})
    trigger = MvCommitsTrigger(job=JOB, source=sources, target=target, app_id=APP_ID, poll_interval=1.0,
                               min_interval=0.0)
    (event,) = run_script(trigger, [None], monkeypatch)
    assert event["airflow_backfill.watermark"] == 5
    assert event["airflow_backfill.watermarks"] == {"a": 3, "b": 2}
    assert event["airflow_backfill.upstream_epochs"] == {a: 3, b: 2}
    assert event["airflow_backfill.source"] == sources


def test_a_downstream_task_reads_the_same_fields_from_a_task_event_and_a_watcher_event():
    fields = {"airflow_backfill.watermark": 7, "airflow_backfill.mv_version": 3}
    from types import SimpleNamespace

    task_event = SimpleNamespace(extra={**fields, "other": 1})
    watcher_event = SimpleNamespace(extra={"from_trigger": True, "payload": fields})
    assert mv_event_fields(task_event) == mv_event_fields(watcher_event) == fields
    assert mv_event_fields({"from_trigger": True, "payload": fields}) == fields
    assert mv_event_fields(SimpleNamespace(extra={})) == {}


def first_event(lake: dict[str, str], version: int, watermark: int) -> dict[str, Any]:
    return {
        "airflow_backfill.job": JOB, "airflow_backfill.phase": "forward", "airflow_backfill.watermark": watermark,
        "airflow_backfill.source": lake["source"], "airflow_backfill.mv_version": version,
        "airflow_backfill.upstream_epochs": {lake["source"]: watermark}, "airflow_backfill.feed_readers": None,
        "airflow_backfill.commits": 1, "airflow_backfill.previous_mv_version": None,
        "airflow_backfill.committed_at": committed_at(lake["target"], version),
    }
