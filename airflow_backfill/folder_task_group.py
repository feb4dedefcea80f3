"""A job's DAG when its folder is backfilled as one: it follows the MV the shared forward
builds, instead of building it.

    wait_caught_up ─> ready

`wait_caught_up` (the same `CaughtUpSensor` as a backfill group's) succeeds once the MV
exists and trails its upstream by at most `lag_threshold` epochs, and its log shows the
MV's watermark and pending epochs on every poke: each MV's progress stays visible per MV.
`ready` emits `caught_up_asset(job)`, on which the DAGs of MVs over this one are scheduled,
and an event on the MV's Asset with the watermark in its `extra` (`MvReadyOperator`); the
Asset's watcher turns the shared forward's later commits into events (`mv_asset`).
"""

from __future__ import annotations

from airflow.sdk import TaskGroup

from airflow_backfill.job import BackfillJob
from airflow_backfill.operators.mv_ready import MvReadyOperator
from airflow_backfill.sensors.lag import CaughtUpSensor
from airflow_backfill.task_group import caught_up_asset, mv_asset, upstream_assets

WAIT_OPTIONS = ("sensor_timeout", "deferrable")
"""The `backfill_task_group` options that apply here too; the others are the phase tasks'."""


def waiting_task_group(job: BackfillJob, *, sensor_timeout: float = 3600.0, deferrable: bool | None = None,
                       group_id: str | None = None) -> TaskGroup:
    """`wait_caught_up ─> ready` for `job`, whose MV another process builds and keeps fresh."""
    with TaskGroup(group_id=group_id or job.name, tooltip=f"{job.target}, built by the shared forward") as group:
        wait = CaughtUpSensor(task_id="wait_caught_up", job=job, timeout=sensor_timeout,
                              **({} if deferrable is None else {"deferrable": deferrable}))
        ready = MvReadyOperator(task_id="ready", job=job, inlets=upstream_assets(job),
                                outlets=[mv_asset(job), caught_up_asset(job)])
        wait >> ready
    return group
