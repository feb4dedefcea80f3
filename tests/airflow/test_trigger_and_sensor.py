"""The lag trigger round-trips through serialization and fires from the Delta logs alone;
the sensor checks before deferring."""

from __future__ import annotations

import asyncio
import importlib

import pyarrow as pa
import pytest
from airflow.exceptions import TaskDeferred
from conftest import commit_upstream_versions, context_with
from helpers_delta import write_mv_version

from airflow_backfill.sensors.lag import CaughtUpSensor
from airflow_backfill.triggers.lag import CaughtUpTrigger

MV_ROWS = pa.table({"order_id": pa.array([0], pa.int64()), "amount": pa.array([0.0])})


def first_event(trigger: CaughtUpTrigger) -> dict:
    async def take() -> dict:
        async for event in trigger.run():
            return event.payload
        raise AssertionError("the trigger ended without an event")

    return asyncio.run(take())


def trigger_for(job, **kwargs) -> CaughtUpTrigger:
    return CaughtUpTrigger(source=job.source, target=job.target, app_id=job.app_id,
                           lag_threshold=job.lag_threshold, poll_interval=0.05, **kwargs)


def test_trigger_serializes_to_a_rebuildable_path_and_kwargs(job):
    trigger = trigger_for(job, reference_version=7, timeout=30.0)
    path, kwargs = trigger.serialize()
    module, _, name = path.rpartition(".")
    rebuilt = getattr(importlib.import_module(module), name)(**kwargs)
    assert rebuilt.serialize() == (path, kwargs)
    assert kwargs["reference_version"] == 7 and kwargs["target"] == job.target


def test_trigger_fires_caught_up_within_the_threshold(job):
    commit_upstream_versions(job.source, 5)  # upstream version 4
    write_mv_version(job.target, MV_ROWS, job.app_id, watermark=3)
    event = first_event(trigger_for(job))
    assert event == {"status": "caught_up", "watermark": 3, "upstream_version": 4, "pending_epochs": 1}


def test_trigger_waits_for_the_mv_to_move(job):
    commit_upstream_versions(job.source, 6)  # upstream version 5, MV at 1: 4 pending

    async def scenario() -> dict:
        write_mv_version(job.target, MV_ROWS, job.app_id, watermark=1)
        runner = trigger_for(job).run()
        waiting = asyncio.ensure_future(runner.__anext__())
        await asyncio.sleep(0.3)
        assert not waiting.done(), "fired while 4 epochs were pending"
        await asyncio.to_thread(write_mv_version, job.target, MV_ROWS, job.app_id, 5)
        event = await asyncio.wait_for(waiting, timeout=10)
        return event.payload

    payload = asyncio.run(scenario())
    assert payload["status"] == "caught_up" and payload["watermark"] == 5


def test_trigger_times_out_with_the_lag_it_saw(job):
    commit_upstream_versions(job.source, 6)
    write_mv_version(job.target, MV_ROWS, job.app_id, watermark=0)
    event = first_event(trigger_for(job, timeout=0.2))
    assert event["status"] == "timeout" and event["pending_epochs"] == 5


def test_trigger_counts_against_the_reference_version(job):
    commit_upstream_versions(job.source, 8)  # latest 7, MV at 3: 4 pending against latest
    write_mv_version(job.target, MV_ROWS, job.app_id, watermark=3)
    event = first_event(trigger_for(job, reference_version=4))
    assert event["status"] == "caught_up" and event["pending_epochs"] == 1


def test_sensor_returns_at_once_when_caught_up(job):
    commit_upstream_versions(job.source, 3)
    write_mv_version(job.target, MV_ROWS, job.app_id, watermark=2)
    sensor = CaughtUpSensor(task_id="wait", job=job)
    assert sensor.execute(context_with()) is None


def test_sensor_defers_to_the_trigger_when_behind(job):
    commit_upstream_versions(job.source, 6)
    write_mv_version(job.target, MV_ROWS, job.app_id, watermark=1)
    sensor = CaughtUpSensor(task_id="wait", job=job, timeout=60)
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(context_with())
    trigger = deferred.value.trigger
    assert isinstance(trigger, CaughtUpTrigger)
    assert (trigger.target, trigger.lag_threshold, trigger.timeout) == (job.target, 1, 60.0)
    assert deferred.value.method_name == "execute_complete"


def test_sensor_fails_clearly_on_a_timeout_event(job):
    sensor = CaughtUpSensor(task_id="wait", job=job, timeout=5)
    event = {"status": "timeout", "watermark": 1, "upstream_version": 9, "pending_epochs": 8}
    with pytest.raises(RuntimeError, match="did not catch up within 5 s: watermark 1, upstream 9, pending epochs 8 > 1"):
        sensor.execute_complete(context_with(), event)


def test_sensor_without_mv_is_not_caught_up(job):
    commit_upstream_versions(job.source, 2)
    sensor = CaughtUpSensor(task_id="wait", job=job, deferrable=False)
    assert sensor.poke(context_with()) is False
