"""The Kafka splits sensor and its trigger (no broker: the split states are given): the
trigger round-trips through serialization, waits until every partition is Finished,
reports an absolute deadline and unreadable state as events; the sensor checks before
deferring and raises Airflow's exceptions."""

from __future__ import annotations

import importlib
import time

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowSensorTimeout, TaskDeferred
from conftest import context_with
from trigger_events import first_event

from airflow_backfill.exceptions import UpstreamError
from airflow_backfill.kafka import status
from airflow_backfill.kafka.config import KafkaPipeline
from airflow_backfill.sensors.kafka import SplitsFinishedSensor
from airflow_backfill.triggers.kafka import SplitsFinishedTrigger


@pytest.fixture
def pipeline(tmp_path) -> KafkaPipeline:
    return KafkaPipeline.from_mapping({
        "upstream": {"bootstrap_servers": "127.0.0.1:9092", "topic": "orders", "value_schema": "id BIGINT"},
        "source_job": {"name": "orders_source", "table": str(tmp_path / "orders")},
        "backfill": {"name": "orders_mv", "query": "SELECT id FROM source", "target": str(tmp_path / "mv")},
    })


@pytest.fixture
def splits(monkeypatch):
    """The split states the sensor and trigger see, one answer per check (the last repeats)."""
    answers: list = []

    def unfinished(job):
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(status, "unfinished_splits", unfinished)
    return answers


def test_trigger_serializes_to_a_rebuildable_path_and_kwargs(pipeline):
    trigger = SplitsFinishedTrigger(pipeline.to_mapping(), poll_interval=0.5, deadline=1_900_000_000.0)
    path, kwargs = trigger.serialize()
    assert path == "airflow_backfill.triggers.kafka.SplitsFinishedTrigger"
    module, _, name = path.rpartition(".")
    rebuilt = getattr(importlib.import_module(module), name)(**kwargs)
    assert rebuilt.serialize() == (path, kwargs)
    assert KafkaPipeline.from_mapping(kwargs["pipeline"]) == pipeline


def test_trigger_waits_until_every_partition_is_finished(pipeline, splits):
    splits.extend([(3, {0: "Backfilling(10)", 2: "SourceCachingUp(7)"}), (3, {2: "SourceCachingUp(9)"}), (3, {})])
    event = first_event(SplitsFinishedTrigger(pipeline.to_mapping(), poll_interval=0.01))
    assert event["status"] == "success" and event["partitions"] == 3 and event["waiting"] == {}
    assert not splits[1:], "fired before the last partition finished"


def test_a_topic_without_partitions_is_not_finished(pipeline, splits):
    splits.append((0, {}))
    event = first_event(SplitsFinishedTrigger(pipeline.to_mapping(), poll_interval=0.01, deadline=time.time() + 0.1))
    assert event["status"] == "timeout"


def test_trigger_times_out_with_the_partitions_still_waiting(pipeline, splits):
    splits.append((2, {1: "SourceCachingUp(4)"}))
    event = first_event(SplitsFinishedTrigger(pipeline.to_mapping(), poll_interval=0.01, deadline=time.time() - 1))
    assert event["status"] == "timeout" and event["waiting"] == {"1": "SourceCachingUp(4)"}
    assert "1 of 2 partitions of orders" in event["message"]


def test_trigger_reports_an_unreadable_state_and_retries_hiccups(pipeline, splits):
    splits.extend([OSError("log being rewritten"), (1, {})])
    assert first_event(SplitsFinishedTrigger(pipeline.to_mapping(), poll_interval=0.01))["status"] == "success"
    splits.clear()
    splits.append(UpstreamError("topic orders does not exist"))
    event = first_event(SplitsFinishedTrigger(pipeline.to_mapping(), poll_interval=0.01))
    assert event["status"] == "error" and "topic orders does not exist" in event["message"]


def test_sensor_returns_at_once_when_finished(pipeline, splits):
    splits.append((2, {}))
    assert SplitsFinishedSensor(task_id="wait", pipeline=pipeline, deferrable=True).execute(context_with()) is None


def test_sensor_defers_to_the_trigger_while_partitions_wait(pipeline, splits):
    splits.append((2, {0: "Backfilling(3)"}))
    sensor = SplitsFinishedSensor(task_id="wait", pipeline=pipeline, timeout=60, deferrable=True)
    before = time.time()
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(context_with())
    trigger = deferred.value.trigger
    assert isinstance(trigger, SplitsFinishedTrigger) and trigger.pipeline == pipeline.to_mapping()
    assert before + 60 <= trigger.deadline <= time.time() + 60
    assert deferred.value.method_name == "execute_complete"


def test_sensor_raises_airflow_exceptions_for_timeout_and_error_events(pipeline):
    sensor = SplitsFinishedSensor(task_id="wait", pipeline=pipeline, timeout=5)
    with pytest.raises(AirflowSensorTimeout, match="orders_mv did not finish within 5 s: 1 of 2 partitions"):
        sensor.execute_complete(context_with(), {"status": "timeout", "message": "1 of 2 partitions ..."})
    with pytest.raises(AirflowException, match="cannot read the splits"):
        sensor.execute_complete(context_with(), {"status": "error", "message": "cannot read the splits of x: gone"})
    with pytest.raises(AirflowException, match="unexpected event"):
        sensor.execute_complete(context_with(), {"status": "finished"})
