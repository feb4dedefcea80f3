"""Build the backfill of one job as a task group:

    pin_epoch -> snapshot -> catch_up -> wait_caught_up -> forward

`pin_epoch` branches, so a run only does what the MV still needs (see
operators/pin_epoch.py); catch-up and forward use the `none_failed_min_one_success`
trigger rule so they still run when the phases before them were skipped. Every task
that commits to the MV declares it as an Asset outlet, so a downstream job's DAG can be
scheduled on it, and the upstream as an inlet. The MV's asset carries a watcher that
reports the commits of a running forward, which no task end reports (`mv_asset`).

An MV built on another MV in the same DAG starts once its upstream MV is caught up, not
once that MV's forward ends (forward may run for as long as the job lives):

    caught_up(upstream_group) >> downstream_group

`pin_epoch` runs unless something before it failed, so the chain also starts when the
upstream MV was already fresh and its catch-up and wait were skipped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import Asset, AssetWatcher, BaseOperator, Param, TaskGroup, TriggerRule, XComArg

from airflow_backfill.hooks.delta import job_source
from airflow_backfill.job import BackfillJob
from airflow_backfill.job_input import as_job
from airflow_backfill.operators.phases import (
    ForwardOperator,
    LogStoreCatchUpOperator,
    MaintainMvOperator,
    SnapshotBackfillOperator,
    VerifyOperator,
)
from airflow_backfill.operators.pin_epoch import PinEpochOperator
from airflow_backfill.sensors.lag import CaughtUpSensor
from airflow_backfill.triggers.mv_commits import MvCommitsTrigger, configured_intervals

if TYPE_CHECKING:
    from airflow.sdk.definitions.mappedoperator import MappedOperator


def delta_table_asset(location: str, watchers: Sequence[AssetWatcher] = ()) -> Asset:
    """A Delta table as an Airflow Asset, named by its URI (`file://<path>` for a path).

    Airflow keeps asset names and URIs each unique: naming the asset by its URI makes a
    table one asset whether a task writes it (an MV) or reads it (an upstream, which may
    be another job's MV in the same deployment).
    """
    uri = location if "://" in location else f"file://{location}"
    return Asset(name=uri, uri=uri, watchers=list(watchers))


def caught_up_asset(job: BackfillJob | Mapping[str, Any] | str) -> Asset:
    """The event that the MV's backfill is done (the MV exists and trails its upstream by
    at most `lag_threshold` epochs): what a DAG of a job over this MV is scheduled on.

    Distinct from `mv_asset`, whose events every commit emits (the snapshot's included),
    so that a job over this MV starts only once the MV is built.
    """
    location = as_job(job).target
    uri = location if "://" in location else f"file://{location}"
    return Asset(name=f"{uri}/_airflow_backfill/caught_up", uri=f"{uri}/_airflow_backfill/caught_up")


def mv_asset(job: BackfillJob | Mapping[str, Any] | str) -> Asset:
    """The MV as an Airflow Asset (`file://<target>`, or its `s3://` URI), for outlets and
    downstream schedules.

    It carries the MV's watcher (`mv_watcher`): while an unpaused DAG is scheduled on the
    MV, Airflow runs it in the triggerer and every forward commit (the shared forward's
    included) reaches that DAG as an asset event. The watcher is not part of the asset's
    identity (its name and URI), so a schedule built before it still names this asset.
    """
    job = as_job(job)
    return delta_table_asset(job.target, [mv_watcher(job)])


def mv_watcher(job: BackfillJob | Mapping[str, Any] | str) -> AssetWatcher:
    """The watcher that turns the MV's forward commits into asset events (one per poll of
    its log at most, coalesced: `triggers/mv_commits.py`), its intervals from the provider's
    settings so that every DAG file that names the MV builds the same one."""
    job = as_job(job)
    poll_interval, min_interval = configured_intervals()
    trigger = MvCommitsTrigger(job=job.name, source=job_source(job), target=job.target, app_id=job.app_id,
                               poll_interval=poll_interval, min_interval=min_interval, aws_conn_id=job.aws_conn_id)
    return AssetWatcher(name=f"{job.name}_commits", trigger=trigger)


def share_watchers(tasks: Iterable[BaseOperator | MappedOperator]) -> None:
    """Make every inlet and outlet of `tasks` that names a watched asset carry its watchers.

    The DAG processor takes an asset's watchers from the last place a DAG file names it,
    inlets included: a job over an MV names that MV as a plain inlet (`upstream_assets`),
    and if it came last, the MV's watcher would be dropped at every parse and added back
    at the next parse of another file.
    """
    tasks = list(tasks)
    watched = {asset.name: asset for task in tasks for asset in (*task.inlets, *task.outlets)
               if isinstance(asset, Asset) and asset.watchers}
    if not watched:
        return

    def with_watchers(assets: list[Any]) -> list[Any]:
        return [watched.get(asset.name, asset) if isinstance(asset, Asset) and not asset.watchers else asset
                for asset in assets]

    for task in tasks:
        task.inlets = with_watchers(task.inlets)
        task.outlets = with_watchers(task.outlets)


def upstream_asset(job: BackfillJob | Mapping[str, Any] | str) -> Asset:
    """The job's upstream as an Airflow Asset (`file://<source>`, or its `s3://` URI), the
    phases' inlet (the first upstream of a join; `upstream_assets` lists them all)."""
    return upstream_assets(job)[0]


def upstream_assets(job: BackfillJob | Mapping[str, Any] | str) -> list[Asset]:
    """Every upstream of the job as an Airflow Asset, in declaration order: the phases' inlets."""
    return [delta_table_asset(upstream.table) for upstream in as_job(job).upstreams]


FORWARD_BOUNDS_FROM_PARAMS: dict[str, str] = {
    "forward_max_epochs": "{{ params.forward_max_epochs }}",
    "forward_idle_timeout": "{{ params.forward_idle_timeout }}",
}
"""`backfill_task_group` arguments that take forward's bounds from the DAG's params
(see `forward_bound_params`), so a manual trigger can change or lift them."""


def forward_bound_params(max_epochs: int | None, idle_timeout: float | None) -> dict[str, Param]:
    """DAG params for forward's bounds, defaulting to the given values; `null` lifts a bound.

    Bounds let `airflow dags test` finish; trigger with
    `--conf '{"forward_max_epochs": null, "forward_idle_timeout": null}'` to run forward
    until the task is stopped.
    """
    return {
        "forward_max_epochs": Param(max_epochs, type=["null", "integer"], minimum=1),
        "forward_idle_timeout": Param(idle_timeout, type=["null", "number"], exclusiveMinimum=0),
    }


def backfill_task_group(
    job: BackfillJob | Mapping[str, Any] | str,
    *,
    group_id: str | None = None,
    conn_id: str = "spark_default",
    forward_max_epochs: int | str | None = None,
    forward_idle_timeout: float | str | None = None,
    sensor_timeout: float = 3600.0,
    spark_conf: Mapping[str, str] | None = None,
    deferrable: bool | None = None,
    verify: bool = False,
    maintenance: bool | Mapping[str, Any] = False,
    catch_up_driver_jit: str = "auto",
    forward: bool = True,
    ready: bool = False,
) -> TaskGroup:
    """The task group that backfills `job` and then keeps its MV up to date.

    :param group_id: defaults to the job's name; also the `dag_run.conf` key of this
        group's own overrides (`--conf '{"<group id>": {"backfill_parallelism": 4}}'`).
    :param forward_max_epochs, forward_idle_timeout: bounds of the forward task
        (templated; unset: forward runs until the task is stopped).
    :param sensor_timeout: seconds `wait_caught_up` waits before failing.
    :param spark_conf: extra `--conf` settings for every spark-submit.
    :param deferrable: whether `wait_caught_up` waits in the triggerer (default: the
        `[operators] default_deferrable` setting).
    :param verify: add a `verify` task after `wait_caught_up` that recomputes the query
        at the MV's watermark and fails when the MV differs (see `airflow-backfill verify`).
    :param maintenance: add a `maintain` task between catch-up and the wait (compaction,
        key clustering, deletion-vector purge; it needs the MV's writer lock, which
        forward holds for as long as it runs): True, or the task's `MaintainMvOperator`
        options, e.g. `{"vacuum": True, "max_file_size": 64 << 20}`.
    :param catch_up_driver_jit: the catch-up driver's JIT compiler, `auto`, `quick` or
        `full` (see `LogStoreCatchUpOperator`).
    :param forward: end with the `forward` task (False: another process keeps the MV
        fresh, such as the shared forward of a folder of jobs, `airflow_backfill.job_folder`).
    :param ready: add a `ready` task that emits `caught_up_asset(job)` once the MV is
        caught up, or at once when it already was (before `forward`, when there is one).
    """
    job = as_job(job)
    group_id = group_id or job.name
    asset = mv_asset(job)
    common: dict[str, Any] = {"job": job, "conn_id": conn_id, "conf": dict(spark_conf or {}),
                              "inlets": upstream_assets(job), "outlets": [asset]}
    sources = ", ".join(upstream.table for upstream in job.upstreams)
    with TaskGroup(group_id=group_id, tooltip=f"{sources} -> {job.target}") as group:
        prefix = f"{group.group_id}."
        common["conf_key"] = group.group_id
        pin = PinEpochOperator(
            task_id="pin_epoch", job=job, trigger_rule=TriggerRule.NONE_FAILED, conf_key=group.group_id,
            snapshot_task_id=prefix + "snapshot", catch_up_task_id=prefix + "catch_up",
            forward_task_id=prefix + ("ready" if ready or not forward else "forward"),
        )
        # The watermarks travel as XComArgs: typed values (an int, not its Jinja rendering)
        # and dependencies Airflow can see.
        pinned_epochs = XComArg(pin, key="pinned_epochs") if job.is_join else None
        snapshot = SnapshotBackfillOperator(task_id="snapshot", epoch=XComArg(pin, key="pinned_epoch"),
                                            epochs=pinned_epochs, **common)
        catch_up = LogStoreCatchUpOperator(
            task_id="catch_up", trigger_rule=TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS,
            driver_jit=catch_up_driver_jit, **common
        )
        wait = CaughtUpSensor(
            task_id="wait_caught_up", job=job, timeout=sensor_timeout,
            reference_version=XComArg(catch_up, key="handover_version"),
            **({} if deferrable is None else {"deferrable": deferrable}),
        )
        tail = _tail_tasks(job, common, forward=forward, ready=ready, forward_max_epochs=forward_max_epochs,
                           forward_idle_timeout=forward_idle_timeout)
        if maintenance:
            options = maintenance if isinstance(maintenance, Mapping) else {}
            maintain = MaintainMvOperator(
                task_id="maintain", trigger_rule=TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS, **options, **common
            )
            pin >> snapshot >> catch_up >> maintain >> wait >> tail[0]
        else:
            pin >> snapshot >> catch_up >> wait >> tail[0]
        pin >> [catch_up, tail[0]]
        if verify:
            checks = {key: value for key, value in common.items() if key != "outlets"}  # reads only
            wait >> VerifyOperator(task_id="verify", **checks)
    if group.dag is not None:  # a group over another group's MV in the same DAG names it as an inlet
        share_watchers(group.dag.tasks)
    return group


def _tail_tasks(
    job: BackfillJob, common: dict[str, Any], *, forward: bool, ready: bool,
    forward_max_epochs: int | str | None, forward_idle_timeout: float | str | None,
) -> list[BaseOperator]:
    """The tasks after `wait_caught_up`, in order: `ready` and/or `forward` (at least one)."""
    tasks: list[BaseOperator] = []
    if ready or not forward:
        tasks.append(EmptyOperator(task_id="ready", trigger_rule=TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS,
                                   outlets=[caught_up_asset(job)]))
    if forward:
        tasks.append(ForwardOperator(
            task_id="forward", trigger_rule=TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS,
            max_epochs=forward_max_epochs, idle_timeout=forward_idle_timeout, **common,
        ))
    if len(tasks) == 2:
        tasks[0] >> tasks[1]
    return tasks


def caught_up(group: TaskGroup) -> BaseOperator:
    """The task of a backfill group after which its MV exists and trails its upstream by
    at most `lag_threshold` epochs: what a group that reads this MV should wait for."""
    task = group.children.get(group.child_id("wait_caught_up"))
    if not isinstance(task, BaseOperator):
        raise TypeError(f"{group.group_id} is not a backfill task group (no wait_caught_up task).")
    return task
