"""Wait until an MV is within `lag_threshold` epochs of its upstream.

Deferrable when `[operators] default_deferrable` says so (or `deferrable=True`): the
wait then runs in the triggerer (CaughtUpTrigger), not in a worker slot. It checks once
before deferring, so an MV that is already caught up costs no deferral at all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import XComArg

from airflow_backfill.hooks.delta import DeltaBackfillHook, job_source
from airflow_backfill.job import BackfillJob
from airflow_backfill.job_input import as_job
from airflow_backfill.sensors.deferrable import DeferrableSensor
from airflow_backfill.serialized_job import SerializesJob

if TYPE_CHECKING:
    from airflow.triggers.base import BaseTrigger


class CaughtUpSensor(SerializesJob, DeferrableSensor):
    """Succeeds once the job's MV trails its upstream by at most `lag_threshold` epochs.

    :param job: the job (a BackfillJob, its mapping, or a YAML file path).
    :param reference_version: count pending epochs against this upstream version instead
        of the latest (templated; the DAG factory passes catch-up's hand-over version).
    :param lag_threshold: defaults to the job's.

    `deferrable` and `trigger_poll_interval` as in `DeferrableSensor`.
    """

    template_fields: Sequence[str] = ("reference_version",)
    ui_color = "#d4e6f1"

    def __init__(
        self,
        *,
        job: BackfillJob | Mapping[str, Any] | str,
        reference_version: int | str | XComArg | None = None,
        lag_threshold: int | None = None,
        **kwargs: Any,
    ) -> None:
        self.job = as_job(job)
        kwargs.setdefault("poke_interval", self.job.poll_interval)
        super().__init__(**kwargs)
        self.reference_version = reference_version
        self.lag_threshold = self.job.lag_threshold if lag_threshold is None else lag_threshold

    def _reference(self) -> int | None:
        value = self.reference_version
        if value in (None, "", "None"):
            return None
        return int(value)  # type: ignore[arg-type]

    def poke(self, context: Any) -> bool:
        hook = DeltaBackfillHook.for_job(self.job)
        lag = hook.lag(self._reference())
        self.log.info("watermark %s, upstream %s, pending epochs %s (threshold %s)",
                      lag.watermark, lag.upstream_version, lag.pending_epochs, self.lag_threshold)
        if lag.upstream_lags is not None:
            self.log.info("pending epochs per upstream: %s", lag.upstream_lags)
        return lag.pending_epochs is not None and lag.pending_epochs <= self.lag_threshold

    def make_trigger(self, deadline: float) -> BaseTrigger:
        from airflow_backfill.triggers.lag import CaughtUpTrigger  # only where a task defers

        return CaughtUpTrigger(
            source=job_source(self.job), target=self.job.target, app_id=self.job.app_id, aws_conn_id=self.job.aws_conn_id,
            lag_threshold=self.lag_threshold, poll_interval=self.trigger_poll_interval,
            reference_version=self._reference(), deadline=deadline,
        )

    def timeout_message(self, event: dict[str, Any]) -> str:
        return (
            f"MV {self.job.target} did not catch up within {float(self.timeout):g} s: watermark "
            f"{event.get('watermark')}, upstream {event.get('upstream_version')}, pending epochs "
            f"{event.get('pending_epochs')} > {self.lag_threshold}. Check the catch-up task's log; "
            "raise lag_threshold or the backfill parallelism if the upstream writes faster."
        )
