"""`ready` of a job whose folder is backfilled as one: the MV is built and caught up.

Emits the MV's caught-up asset (what the DAGs of MVs over it are scheduled on) and an
event on the MV's Asset with the phase tasks' `extra` (`asset_events.event_extra`: the
watermark, upstream epochs, MV version, feed readers), as the per-job shape's `catch_up`
task does: a DAG scheduled on the MV runs once it is built, and after the shared
forward's commits through the MV's watcher.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import Asset, BaseOperator

from airflow_backfill.hooks.delta import DeltaBackfillHook
from airflow_backfill.job import BackfillJob

PHASE = "ready"


class MvReadyOperator(BaseOperator):
    """Announce `job`'s MV, built by another process (the shared forward), as caught up."""

    ui_color = "#e8f6f3"

    def __init__(self, *, job: BackfillJob, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.job = job

    def execute(self, context: Any) -> int | None:
        from airflow_backfill.asset_events import event_extra

        hook = DeltaBackfillHook.for_job(self.job)
        watermark = hook.watermark()
        self.log.info("MV %s is built, at watermark %s", self.job.target, watermark)
        outlet_events = context.get("outlet_events")
        if outlet_events is not None:
            extra = event_extra(hook, job=self.job.name, phase=PHASE, watermark=watermark)
            for outlet in self.outlets:
                if isinstance(outlet, Asset):
                    outlet_events[outlet].extra = dict(extra)
        return watermark
