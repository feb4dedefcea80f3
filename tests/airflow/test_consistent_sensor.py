"""The consistent-versions trigger round-trips through serialization, fires from the Delta logs
alone once the MVs agree at or past the given epochs, and reports waiting, timeouts and
errors as events; the sensor checks before deferring, hands the versions over as XCom and
turns the trigger's events into success or Airflow's exceptions."""

from __future__ import annotations

import asyncio
import importlib
import time
from pathlib import Path

import pytest
from airflow.sdk import PokeReturnValue
from airflow.sdk.exceptions import AirflowException, AirflowSensorTimeout, TaskDeferred
from consistency_tables import mv, mv_commit, rows_at, upstream
from trigger_events import first_event

from airflow_backfill.consistent_reads import table_spec
from airflow_backfill.engine.consistency.answer import ConsistentVersions
from airflow_backfill.exceptions import BackfillConfigError
from airflow_backfill.job import BackfillJob
from airflow_backfill.sensors.consistent import ConsistentVersionsSensor
from airflow_backfill.triggers.consistent import ConsistentVersionsTrigger


def make_job(root: Path, name: str, source: str, **fields) -> BackfillJob:
    return BackfillJob(name=name, source=source, target=str(root / name), query="SELECT id FROM source",
                       primary_key=["id"], **fields)


@pytest.fixture
def mvs(tmp_path: Path) -> tuple[str, BackfillJob, BackfillJob]:
    """Two MVs over `orders` (versions 0..9) that last met at epoch 4."""
    orders = upstream(str(tmp_path / "orders"), 10)
    a, b = make_job(tmp_path, "a", orders), make_job(tmp_path, "b", orders)
    mv(a.target, "a", orders, [2, 4, 6])
    mv(b.target, "b", orders, [3, 4, 7])
    return orders, a, b


def trigger_for(*jobs: BackfillJob, min_epochs: dict[str, int], **kwargs) -> ConsistentVersionsTrigger:
    return ConsistentVersionsTrigger(tables=[table_spec(job).to_dict() for job in jobs], min_epochs=min_epochs,
                                     history=100, poll_interval=0.05, **kwargs)


def test_trigger_serializes_to_a_rebuildable_path_and_kwargs(mvs):
    _, a, b = mvs
    trigger = trigger_for(a, b, min_epochs={"/lake/orders": 4}, deadline=1_900_000_000.5, aws_conn_id="lake")
    path, kwargs = trigger.serialize()
    assert path == "airflow_backfill.triggers.consistent.ConsistentVersionsTrigger"
    assert kwargs == {"tables": [table_spec(a).to_dict(), table_spec(b).to_dict()],
                      "min_epochs": {"/lake/orders": 4}, "history": 100, "poll_interval": 0.05,
                      "deadline": 1_900_000_000.5, "aws_conn_id": "lake"}
    module, _, name = path.rpartition(".")
    rebuilt = getattr(importlib.import_module(module), name)(**kwargs)
    assert rebuilt.serialize() == (path, kwargs)


def test_trigger_fires_with_the_agreeing_versions(mvs):
    orders, a, b = mvs
    event = first_event(trigger_for(a, b, min_epochs={orders: 4}))
    assert event["status"] == "success" and event["epochs"] == {orders: 4}
    answer = ConsistentVersions.from_dict(event["versions"])
    assert rows_at(a.target, answer.version("a")) == rows_at(b.target, answer.version("b")) == ["4"]


def test_trigger_waits_until_the_mvs_meet_at_the_least_epoch(mvs):
    orders, a, b = mvs

    async def scenario() -> dict:
        runner = trigger_for(a, b, min_epochs={orders: 7}).run()
        waiting = asyncio.ensure_future(runner.__anext__())
        await asyncio.sleep(0.5)
        assert not waiting.done(), "fired while the MVs last met at epoch 4"
        await asyncio.to_thread(mv_commit, a.target, "a", orders, 7)
        event = await asyncio.wait_for(waiting, timeout=30)
        return event.payload

    payload = asyncio.run(scenario())
    assert payload["status"] == "success" and payload["epochs"] == {orders: 7}
    assert payload["versions"]["tables"]["a"]["version"] == 3


def test_trigger_times_out_with_what_it_saw(mvs):
    orders, a, b = mvs
    event = first_event(trigger_for(a, b, min_epochs={orders: 9}, deadline=time.time() + 0.3))
    assert event["status"] == "timeout" and event["epochs"] == {orders: 4}
    assert "not yet at or past" in event["message"]
    mv_commit(a.target, "a", orders, 8)
    event = first_event(trigger_for(a, b, min_epochs={}, deadline=time.time() - 1))
    assert event["status"] == "success"  # any agreement will do: epoch 4 is still one


def test_trigger_reports_a_table_it_cannot_map_as_an_error(tmp_path):
    orders = upstream(str(tmp_path / "orders"), 3)
    customers = upstream(str(tmp_path / "customers"), 3)
    joined = BackfillJob(name="joined", target=str(tmp_path / "joined"), query="SELECT 1 AS x FROM o JOIN c ON true",
                         sources={"o": {"table": orders, "primary_key": ["id"]},
                                  "c": {"table": customers, "primary_key": ["id"]}})
    mv_commit(joined.target, "joined", {"o": orders, "c": customers}, watermark=3)  # no vector beside it
    event = first_event(trigger_for(joined, min_epochs={}))
    assert event["status"] == "error" and "do not match its watermark 3" in event["message"]


def test_sensor_returns_the_versions_at_once_when_they_agree(mvs):
    orders, a, b = mvs
    sensor = ConsistentVersionsSensor(task_id="wait", tables=[a, b.target], min_epochs="orders=4", deferrable=True)
    versions = sensor.execute({})
    answer = ConsistentVersions.from_dict(versions)
    assert answer.epochs == {orders: 4} and answer.tables["b"].kind == "mv"  # b named by its path: from its log
    poked = sensor.poke({})
    assert isinstance(poked, PokeReturnValue) and poked.xcom_value == versions


def test_sensor_defers_until_the_epoch_then_hands_over_the_triggers_versions(mvs):
    orders, a, b = mvs
    sensor = ConsistentVersionsSensor(task_id="wait", tables=[a, b], min_epochs=6, deferrable=True, timeout=60)
    assert sensor.poke({}) is False
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute({})
    trigger = deferred.value.trigger
    assert isinstance(trigger, ConsistentVersionsTrigger) and trigger.min_epochs == {orders: 6}
    mv_commit(b.target, "b", orders, 6)
    event = first_event(trigger)
    assert ConsistentVersions.from_dict(sensor.execute_complete({}, event)).epochs == {orders: 6}
    with pytest.raises(AirflowSensorTimeout, match=r"did not agree at or past 6 within 60 s"):
        sensor.execute_complete({}, {"status": "timeout", "message": "agree at orders@4"})
    with pytest.raises(AirflowException, match="cannot read"):
        sensor.execute_complete({}, {"status": "error", "message": "cannot read the versions of a, b"})


def test_sensor_refuses_bad_arguments_when_the_dag_is_parsed(tmp_path, mvs):
    orders, a, _ = mvs
    with pytest.raises(BackfillConfigError, match="tables must list the MVs"):
        ConsistentVersionsSensor(task_id="wait", tables=[])
    with pytest.raises(BackfillConfigError, match="history must be a positive number"):
        ConsistentVersionsSensor(task_id="wait", tables=[a], history=0)
    on_s3 = [make_job(tmp_path, f"s3_{n}", orders, aws_conn_id=f"lake_{n}") for n in (1, 2)]
    with pytest.raises(BackfillConfigError, match="different aws_conn_id"):
        ConsistentVersionsSensor(task_id="wait", tables=on_s3)
    with pytest.raises(BackfillConfigError, match="'customers' is not an upstream table"):
        ConsistentVersionsSensor(task_id="wait", tables=[a], min_epochs="customers=3").poke({})
