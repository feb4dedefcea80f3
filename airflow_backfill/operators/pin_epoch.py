"""The first task of a backfill: validate, pin the snapshot epoch, and choose the route.

Everything a user can get wrong (dag_run.conf overrides, the query, a missing upstream
or one without the Change Data Feed) fails here, before any Spark work. The route
depends on what the MV already reflects:

- no MV yet            -> snapshot, catch-up, forward (snapshot at the pinned epoch)
- MV behind the lag    -> catch-up, forward
- MV within the lag    -> forward only

A join pins a version of every upstream: `pinned_epochs`, `upstream_versions` and
`mv_watermarks` are mappings by upstream name, and the single-number XComs are their
sums (the scale of the MV's app transaction, on which the lag threshold counts).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow.providers.standard.operators.branch import BaseBranchOperator

from airflow_backfill.hooks.delta import DeltaBackfillHook
from airflow_backfill.job import BackfillJob
from airflow_backfill.job_input import as_job
from airflow_backfill.overrides import group_overrides, job_overrides
from airflow_backfill.serialized_job import SerializesJob


class PinEpochOperator(SerializesJob, BaseBranchOperator):
    """Branch to the phases the MV still needs; push `pinned_epoch` and the lag to XCom.

    :param job: the job (BackfillJob, mapping, or YAML path).
    :param snapshot_task_id, catch_up_task_id, forward_task_id: full ids of the phase tasks.
    :param conf_key: the `dag_run.conf` key of this job's own overrides (default: the
        job's name; the task group factory passes its group id).
    """

    ui_color = "#fdebd0"

    def __init__(
        self,
        *,
        job: BackfillJob | Mapping[str, Any] | str,
        snapshot_task_id: str,
        catch_up_task_id: str,
        forward_task_id: str,
        conf_key: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.job = as_job(job)
        self.conf_key = conf_key or self.job.name
        self.snapshot_task_id = snapshot_task_id
        self.catch_up_task_id = catch_up_task_id
        self.forward_task_id = forward_task_id

    def choose_branch(self, context: Any) -> list[str]:
        # sqlglot and delta-rs load when the task runs, not when the DAG file is parsed.
        from airflow_backfill.engine.delta.retention import margin_warnings, retention_warnings
        from airflow_backfill.engine.planning.query import plan_query
        from airflow_backfill.engine.snapshot_chunks.progress import load_progress

        dag_run = context.get("dag_run")
        overrides = group_overrides(getattr(dag_run, "conf", None) or {}, self.conf_key)
        job = self.job.with_overrides(**job_overrides(overrides))
        if overrides:
            self.log.info("this run's overrides: %s", overrides)
        hook = DeltaBackfillHook.for_job(job)
        if job.is_join:
            from airflow_backfill.engine.joins.rounds import join_plan

            versions = hook.check_upstreams()
            join_plan(job)
            watermarks = hook.watermarks()
        else:
            plan_query(job.query, job.primary_key)
            versions = {"source": hook.check_upstream(key=job.primary_key)}
            watermark = hook.watermark()
            watermarks = None if watermark is None else {"source": watermark}
        upstream_version = sum(versions.values())
        ti = context["ti"]
        ti.xcom_push(key="upstream_version", value=upstream_version)
        ti.xcom_push(key="mv_watermark", value=None if watermarks is None else sum(watermarks.values()))
        if job.is_join:
            ti.xcom_push(key="upstream_versions", value=versions)
            ti.xcom_push(key="mv_watermarks", value=watermarks)
        uris = {upstream.name: upstream.table for upstream in job.upstreams}
        if watermarks is None:
            unfinished = load_progress(job.target)
            pinned = versions
            if unfinished is not None:
                pinned = unfinished.epochs if job.is_join else {"source": unfinished.epoch}
                self.log.info("an unfinished snapshot at %s resumes (%s of %s chunks done)",
                              pinned, len(unfinished.done), unfinished.chunks_total)
            self.log.info("no MV yet: snapshot of %s pinned at %s", ", ".join(uris.values()),
                          pinned if job.is_join else f"epoch {pinned['source']}")
            for uri in uris.values():
                retention_warnings(uri, job.backfill_parallelism)
            ti.xcom_push(key="pinned_epoch", value=sum(pinned.values()))
            if job.is_join:
                ti.xcom_push(key="pinned_epochs", value=pinned)
            return [self.snapshot_task_id, self.catch_up_task_id, self.forward_task_id]
        watermark = sum(watermarks.values())
        pending = upstream_version - watermark
        ti.xcom_push(key="pinned_epoch", value=watermark)
        if job.is_join:
            ti.xcom_push(key="pinned_epochs", value=watermarks)
        for name, uri in uris.items():
            margin_warnings(uri, watermarks[name])
        if pending > job.lag_threshold:
            self.log.info("MV at watermark %s, upstream at %s: %s pending epochs > threshold %s; "
                          "snapshot skipped, catch-up runs", watermark, upstream_version, pending, job.lag_threshold)
            return [self.catch_up_task_id, self.forward_task_id]
        self.log.info("MV at watermark %s is within %s epochs of the upstream (%s): only forward runs",
                      watermark, job.lag_threshold, upstream_version)
        return [self.forward_task_id]
