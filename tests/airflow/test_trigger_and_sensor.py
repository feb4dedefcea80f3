"""The lag trigger round-trips through serialization, fires from the Delta logs alone and
reports errors and an absolute deadline as events; the sensor checks before deferring,
follows `default_deferrable` and raises Airflow's exceptions."""

from __future__ import annotations

import asyncio
import importlib
import time

import pyarrow as pa
import pytest
from airflow.sdk.exceptions import AirflowException, AirflowSensorTimeout, TaskDeferred
from conftest import commit_upstream_versions, context_with
from helpers_delta import write_mv_version
from trigger_events import first_event

from airflow_backfill.exceptions import AccessDeniedError, UnreachableError
from airflow_backfill.sensors.lag import CaughtUpSensor
from airflow_backfill.triggers.lag import CaughtUpTrigger

MV_ROWS = pa.table({"order_id": pa.array([0], pa.int64()), "amount": pa.array([0.0])})


def trigger_for(job, **kwargs) -> CaughtUpTrigger:
    return CaughtUpTrigger(source=job.source, target=job.target, app_id=job.app_id,
                           lag_threshold=job.lag_threshold, poll_interval=0.05, **kwargs)


def test_trigger_serializes_to_a_rebuildable_path_and_kwargs(job):
    trigger = trigger_for(job, reference_version=7, deadline=1_900_000_000.5, aws_conn_id="lake")
    path, kwargs = trigger.serialize()
    assert path == "airflow_backfill.triggers.lag.CaughtUpTrigger"
    assert kwargs == {"source": job.source, "target": job.target, "app_id": job.app_id, "lag_threshold": 1,
                      "poll_interval": 0.05, "reference_version": 7, "deadline": 1_900_000_000.5,
                      "aws_conn_id": "lake"}
    module, _, name = path.rpartition(".")
    rebuilt = getattr(importlib.import_module(module), name)(**kwargs)
    assert rebuilt.serialize() == (path, kwargs)


def test_trigger_fires_caught_up_within_the_threshold(job):
    commit_upstream_versions(job.source, 5)  # upstream version 4
    write_mv_version(job.target, MV_ROWS, job.app_id, watermark=3)
    event = first_event(trigger_for(job))
    assert event.pop("message").startswith(f"MV {job.target} caught up")
    assert event == {"status": "success", "watermark": 3, "upstream_version": 4, "pending_epochs": 1}


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
    assert payload["status"] == "success" and payload["watermark"] == 5


def test_trigger_times_out_with_the_lag_it_saw(job):
    commit_upstream_versions(job.source, 6)
    write_mv_version(job.target, MV_ROWS, job.app_id, watermark=0)
    event = first_event(trigger_for(job, deadline=time.time() + 0.2))
    assert event["status"] == "timeout" and event["pending_epochs"] == 5


def test_a_rebuilt_trigger_keeps_the_original_deadline(job):
    """A triggerer restart rebuilds the trigger from serialize(): a deadline already past
    fires at the first poll instead of starting a new wait."""
    commit_upstream_versions(job.source, 6)
    write_mv_version(job.target, MV_ROWS, job.app_id, watermark=0)
    _, kwargs = trigger_for(job, deadline=time.time() - 1).serialize()
    started = time.monotonic()
    event = first_event(CaughtUpTrigger(**kwargs))
    assert event["status"] == "timeout" and time.monotonic() - started < 5


def test_trigger_sends_an_error_event_when_the_upstream_is_missing(job):
    event = first_event(trigger_for(job))
    assert event["status"] == "error" and job.source in event["message"]


def test_trigger_retries_a_transient_failure_then_reports_it(job, monkeypatch):
    commit_upstream_versions(job.source, 3)
    write_mv_version(job.target, MV_ROWS, job.app_id, watermark=2)
    from airflow_backfill.hooks.delta import DeltaBackfillHook

    real_lag, calls = DeltaBackfillHook.lag, []

    def flaky(self, reference_version=None):
        calls.append(1)
        if len(calls) == 1:
            raise OSError("log being rewritten")
        return real_lag(self, reference_version)

    monkeypatch.setattr(DeltaBackfillHook, "lag", flaky)
    assert first_event(trigger_for(job))["status"] == "success" and len(calls) == 2

    monkeypatch.setattr(DeltaBackfillHook, "lag", lambda self, reference_version=None: 1 / 0)
    event = first_event(trigger_for(job))
    assert event["status"] == "error" and "ZeroDivisionError" in event["message"]


def test_trigger_waits_out_an_unreachable_store_but_not_refused_credentials(job, monkeypatch):
    commit_upstream_versions(job.source, 3)
    write_mv_version(job.target, MV_ROWS, job.app_id, watermark=2)
    from airflow_backfill.hooks.delta import DeltaBackfillHook

    real_lag, calls = DeltaBackfillHook.lag, []

    def failing_once(error: Exception):
        def lag(self, reference_version=None):
            calls.append(error)
            if len(calls) == 1:
                raise error
            return real_lag(self, reference_version)
        return lag

    monkeypatch.setattr(DeltaBackfillHook, "lag", failing_once(UnreachableError("cannot reach the store")))
    assert first_event(trigger_for(job))["status"] == "success" and len(calls) == 2
    calls.clear()
    monkeypatch.setattr(DeltaBackfillHook, "lag", failing_once(AccessDeniedError("the store refused the key")))
    trigger = trigger_for(job)
    assert first_event(trigger) == {"status": "error", "message": f"cannot read {trigger.subject}: the store refused the key"}
    assert len(calls) == 1


def test_trigger_counts_against_the_reference_version(job):
    commit_upstream_versions(job.source, 8)  # latest 7, MV at 3: 4 pending against latest
    write_mv_version(job.target, MV_ROWS, job.app_id, watermark=3)
    event = first_event(trigger_for(job, reference_version=4))
    assert event["status"] == "success" and event["pending_epochs"] == 1


def test_sensor_returns_at_once_when_caught_up(job):
    commit_upstream_versions(job.source, 3)
    write_mv_version(job.target, MV_ROWS, job.app_id, watermark=2)
    sensor = CaughtUpSensor(task_id="wait", job=job)
    assert sensor.execute(context_with()) is None


def test_sensor_defers_to_the_trigger_when_behind(job):
    commit_upstream_versions(job.source, 6)
    write_mv_version(job.target, MV_ROWS, job.app_id, watermark=1)
    sensor = CaughtUpSensor(task_id="wait", job=job, timeout=60, deferrable=True)
    before = time.time()
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(context_with())
    trigger = deferred.value.trigger
    assert isinstance(trigger, CaughtUpTrigger)
    assert (trigger.target, trigger.lag_threshold, trigger.poll_interval) == (job.target, 1, 10.0)
    assert before + 60 <= trigger.deadline <= time.time() + 60
    assert deferred.value.method_name == "execute_complete"


@pytest.mark.parametrize("sensor", ["lag", "kafka"])
def test_sensors_follow_the_default_deferrable_setting_when_the_dag_is_parsed(job, tmp_path, monkeypatch, sensor):
    from airflow_backfill.kafka.config import KafkaPipeline
    from airflow_backfill.sensors.kafka import SplitsFinishedSensor

    def build(**kwargs):
        if sensor == "lag":
            return CaughtUpSensor(task_id="wait", job=job, **kwargs)
        pipeline = KafkaPipeline.from_mapping({
            "upstream": {"bootstrap_servers": "127.0.0.1:9092", "topic": "t", "value_schema": "id BIGINT"},
            "source_job": {"name": "s", "table": str(tmp_path / "s")},
            "backfill": {"name": "b", "query": "SELECT id FROM source", "target": str(tmp_path / "b")},
        })
        return SplitsFinishedSensor(task_id="wait", pipeline=pipeline, **kwargs)

    assert build().deferrable is False  # Airflow's default
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "True")
    assert build().deferrable is True
    assert build(deferrable=False).deferrable is False


def test_sensor_fails_clearly_on_a_timeout_event(job):
    sensor = CaughtUpSensor(task_id="wait", job=job, timeout=5)
    event = {"status": "timeout", "watermark": 1, "upstream_version": 9, "pending_epochs": 8}
    with pytest.raises(AirflowSensorTimeout,
                       match="did not catch up within 5 s: watermark 1, upstream 9, pending epochs 8 > 1"):
        sensor.execute_complete(context_with(), event)


def test_sensor_raises_the_error_event_message(job):
    sensor = CaughtUpSensor(task_id="wait", job=job)
    with pytest.raises(AirflowException, match="cannot read the lag of MV x: gone"):
        sensor.execute_complete(context_with(), {"status": "error", "message": "cannot read the lag of MV x: gone"})
    with pytest.raises(AirflowException, match="unexpected event"):
        sensor.execute_complete(context_with(), {"status": "caught_up"})


def test_sensor_without_mv_is_not_caught_up(job):
    commit_upstream_versions(job.source, 2)
    sensor = CaughtUpSensor(task_id="wait", job=job, deferrable=False)
    assert sensor.poke(context_with()) is False
