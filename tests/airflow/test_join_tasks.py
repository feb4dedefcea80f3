"""A join in Airflow: pin_epoch pins every upstream (XCom mappings), the hook, sensor and
trigger count the lag per upstream, the task group makes every upstream an inlet and
passes the pinned vector to the snapshot, lineage lists every upstream, and the status
shows each upstream's lag. Hand-built tables, no Spark."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import context_with
from deltalake import CommitProperties, Transaction, write_deltalake
from trigger_events import first_event

from airflow_backfill.engine.snapshot_chunks.progress import SnapshotProgress, save_progress
from airflow_backfill.engine.status import format_status, job_status
from airflow_backfill.exceptions import UnsupportedQueryError
from airflow_backfill.hooks.delta import DeltaBackfillHook
from airflow_backfill.job import BackfillJob
from airflow_backfill.operators.pin_epoch import PinEpochOperator
from airflow_backfill.task_group import backfill_task_group, upstream_assets
from airflow_backfill.triggers.lag import CaughtUpTrigger

IDS = {"snapshot_task_id": "g.snapshot", "catch_up_task_id": "g.catch_up", "forward_task_id": "g.forward"}
QUERY = "SELECT i.i_order, i.i_line, o.o_status FROM items i JOIN orders o ON i.i_order = o.o_id"
SCHEMAS = {
    "orders": pa.schema([pa.field("o_id", pa.int64()), pa.field("o_status", pa.string())]),
    "items": pa.schema([pa.field("i_order", pa.int64()), pa.field("i_line", pa.int32())]),
}
MV_ROWS = pa.table({"i_order": pa.array([1], pa.int64()), "i_line": pa.array([0], pa.int32()),
                    "o_status": pa.array(["o"])})


@pytest.fixture
def join_job(tmp_path) -> BackfillJob:
    return BackfillJob(
        name="joined", target=str(tmp_path / "mv"), query=QUERY, lag_threshold=1, poll_interval=0.05,
        sources={"orders": {"table": str(tmp_path / "orders"), "primary_key": ["o_id"]},
                 "items": {"table": str(tmp_path / "items"), "primary_key": ["i_order", "i_line"]}},
    )


def commit_versions(job: BackfillJob, versions: dict[str, int]) -> None:
    """Each upstream at the given latest version (one empty append per version)."""
    for upstream in job.upstreams:
        for _ in range(versions[upstream.name] + 1):
            write_deltalake(upstream.table, SCHEMAS[upstream.name].empty_table(), mode="append",
                            configuration={"delta.enableChangeDataFeed": "true"})


def write_join_mv(job: BackfillJob, vector: dict[str, int]) -> None:
    """A hand-built join MV at `vector`: the sum as app transaction, the vector in the metadata."""
    properties = CommitProperties(
        app_transactions=[Transaction(job.app_id, sum(vector.values()))],
        custom_metadata={"airflow_backfill.watermarks": json.dumps(vector), "airflow_backfill.phase": "forward"},
    )
    write_deltalake(job.target, MV_ROWS, mode="overwrite", commit_properties=properties)


def pin(job: BackfillJob) -> PinEpochOperator:
    return PinEpochOperator(task_id="pin_epoch", job=job, **IDS)


def test_pin_epoch_pins_every_upstream_of_a_new_join(join_job):
    commit_versions(join_job, {"orders": 3, "items": 5})
    context = context_with()
    assert pin(join_job).choose_branch(context) == ["g.snapshot", "g.catch_up", "g.forward"]
    assert context["ti"].pushed == {
        "upstream_version": 8, "mv_watermark": None, "upstream_versions": {"orders": 3, "items": 5},
        "mv_watermarks": None, "pinned_epoch": 8, "pinned_epochs": {"orders": 3, "items": 5}}


def test_an_unfinished_join_snapshot_keeps_its_versions(join_job):
    commit_versions(join_job, {"orders": 3, "items": 5})
    save_progress(join_job.target, SnapshotProgress(epoch=3, chunks_total=2, rows_total=2, files_total=2,
                                                    epochs={"orders": 1, "items": 2}))
    context = context_with()
    pin(join_job).choose_branch(context)
    assert (context["ti"].pushed["pinned_epochs"], context["ti"].pushed["pinned_epoch"]) == (
        {"orders": 1, "items": 2}, 3)


@pytest.mark.parametrize(("vector", "route"), [
    ({"orders": 1, "items": 5}, ["g.catch_up", "g.forward"]),  # orders 2 behind: 2 pending > 1
    ({"orders": 3, "items": 4}, ["g.forward"]),  # 1 pending <= 1
])
def test_pin_epoch_routes_a_join_by_the_sum_of_its_lags(join_job, vector, route):
    commit_versions(join_job, {"orders": 3, "items": 5})
    write_join_mv(join_job, vector)
    context = context_with()
    assert pin(join_job).choose_branch(context) == route
    assert context["ti"].pushed["mv_watermarks"] == vector
    assert context["ti"].pushed["pinned_epochs"] == vector and context["ti"].pushed["mv_watermark"] == sum(
        vector.values())


def test_an_unsupported_join_is_refused_when_the_job_loads_before_any_task(join_job):
    commit_versions(join_job, {"orders": 0, "items": 0})
    with pytest.raises(UnsupportedQueryError, match="FULL OUTER JOIN o is not supported"):
        join_job.with_overrides(query=QUERY.replace("JOIN", "FULL OUTER JOIN"))


def test_the_lag_and_the_trigger_split_the_pending_epochs_by_upstream(join_job):
    commit_versions(join_job, {"orders": 3, "items": 5})
    write_join_mv(join_job, {"orders": 1, "items": 5})
    lag = DeltaBackfillHook.for_job(join_job).lag()
    assert (lag.upstream_version, lag.watermark, lag.pending_epochs, lag.upstream_lags) == (
        8, 6, 2, {"orders": 2, "items": 0})
    trigger = CaughtUpTrigger(source={u.name: u.table for u in join_job.upstreams}, target=join_job.target,
                              app_id=join_job.app_id, lag_threshold=2, poll_interval=0.05)
    path, kwargs = trigger.serialize()
    assert CaughtUpTrigger(**kwargs).serialize() == (path, kwargs)
    event = first_event(trigger)
    event.pop("message")
    assert event == {"status": "success", "watermark": 6, "upstream_version": 8, "pending_epochs": 2,
                     "upstream_lags": {"orders": 2, "items": 0}}


def test_the_task_group_pins_the_vector_and_takes_every_upstream_as_inlet(join_job):
    from airflow.sdk import DAG

    with DAG("joined", schedule=None):
        group = backfill_task_group(join_job)
    tasks = {task.task_id.split(".")[-1]: task for task in group.children.values()}
    snapshot = tasks["snapshot"]
    assert snapshot.epochs.key == "pinned_epochs"
    assert [asset.uri for asset in snapshot.inlets] == [f"file://{u.table}" for u in join_job.upstreams]
    assert snapshot.inlets == upstream_assets(join_job) and tasks["forward"].inlets == upstream_assets(join_job)
    sensor = tasks["wait_caught_up"]
    sensor.reference_version = None  # rendered from catch-up's XCom when it runs
    assert sensor.make_trigger(deadline=1.0).source == {u.name: u.table for u in join_job.upstreams}
    snapshot.epoch, snapshot.epochs = 8, {"orders": 3, "items": 5}  # as rendered from pin_epoch's XCom
    assert snapshot.phase_arguments({}, {}) == ["--epochs", "items=5,orders=3"]


@pytest.mark.parametrize("text", ["items=5,orders=3", '{"orders": 3, "items": 5}'])
def test_the_snapshot_entry_point_reads_the_pinned_vector_as_the_task_logs_it_or_as_json(text):
    from airflow_backfill.spark_jobs.snapshot import parse_args

    args = parse_args(["--job", "job.json", "--epochs", text])
    assert args.epochs == {"orders": 3, "items": 5} and args.epoch is None


@pytest.mark.parametrize("text", ["orders=3,items", "orders=-1", "orders=x", "{}", "[3]"])
def test_the_snapshot_entry_point_refuses_a_vector_without_every_version(text, capsys):
    from airflow_backfill.spark_jobs.snapshot import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--job", "job.json", "--epochs", text])
    assert "--epochs must name each upstream's version" in capsys.readouterr().err


def test_the_status_shows_each_upstreams_lag(join_job):
    commit_versions(join_job, {"orders": 3, "items": 5})
    write_join_mv(join_job, {"orders": 1, "items": 5})
    status = job_status(join_job)
    assert (status.watermark, status.upstream_version, status.pending_epochs) == (6, 8, 2)
    assert [(u["name"], u["upstream_version"], u["watermark"], u["pending_epochs"]) for u in status.upstreams] == [
        ("orders", 3, 1, 2), ("items", 5, 5, 0)]
    text = format_status(status)
    assert "upstream        orders: version 3, watermark 1, pending 2" in text
    assert "upstream        items: version 5, watermark 5, pending 0" in text


def test_lineage_lists_every_upstream_and_where_each_column_comes_from(join_job):
    pytest.importorskip("airflow.providers.openlineage")
    from airflow_backfill.lineage import phase_lineage

    commit_versions(join_job, {"orders": 0, "items": 0})
    lineage = phase_lineage(join_job, "snapshot", 0)
    assert [d.name for d in lineage.inputs] == [u.table for u in join_job.upstreams]
    fields = lineage.outputs[0].facets["columnLineage"].fields
    assert {column: [(f.name, f.field) for f in fields[column].inputFields] for column in fields} == {
        "i_order": [(join_job.upstreams[1].table, "i_order")], "i_line": [(join_job.upstreams[1].table, "i_line")],
        "o_status": [(join_job.upstreams[0].table, "o_status")]}


def test_the_q3_example_dag_imports_and_matches_its_job_file(monkeypatch, tmp_path):
    from airflow.dag_processing.dagbag import DagBag

    from airflow_backfill.job import load_job

    monkeypatch.setenv("AIRFLOW_BACKFILL_HOME", str(tmp_path))
    root = Path(__file__).resolve().parents[2]
    bag = DagBag(dag_folder=str(root / "dags" / "example_tpch_q3.py"))
    assert bag.import_errors == {}
    dag = bag.get_dag("example_tpch_q3")
    snapshot = dag.get_task("q3.snapshot")
    assert [asset.uri for asset in snapshot.inlets] == [f"file://{tmp_path}/tpch/{name}"
                                                        for name in ("customer", "orders", "lineitem")]
    job = load_job(root / "jobs" / "tpch_q3.yaml")
    assert job.with_overrides(query=" ".join(job.query.split())) == snapshot.job.with_overrides(
        query=" ".join(snapshot.job.query.split()))


def test_the_ui_view_of_a_join_has_its_status_and_no_single_upstream_lag_history(join_job):
    from airflow_backfill.plugins.api import job_view
    from airflow_backfill.plugins.jobs import KnownJob

    commit_versions(join_job, {"orders": 3, "items": 5})
    write_join_mv(join_job, {"orders": 1, "items": 5})
    view = job_view(KnownJob(join_job, ("joined",)), can_edit=False)
    assert view["error"] is None and view["lag_history"] == []
    assert [(u["name"], u["pending_epochs"]) for u in view["status"]["upstreams"]] == [("orders", 2), ("items", 0)]
