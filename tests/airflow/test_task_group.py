"""The factory's task group, the example DAG and the provider registration."""

from __future__ import annotations

from importlib.metadata import entry_points, metadata
from pathlib import Path

import pendulum
import pytest
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG, TaskGroup, TriggerRule, XComArg

from airflow_backfill.exceptions import BackfillConfigError
from airflow_backfill.get_provider_info import get_provider_info
from airflow_backfill.job import BackfillJob, load_job
from airflow_backfill.task_group import backfill_task_group, caught_up, mv_asset

ROOT = Path(__file__).resolve().parents[2]


def test_group_wires_the_three_phases_with_skippable_routes(job):
    with DAG("g", schedule=None, start_date=pendulum.datetime(2026, 1, 1)) as dag:
        backfill_task_group(job, group_id="orders", forward_max_epochs=3)
    tasks = {task.task_id: task for task in dag.tasks}
    upstream = {task_id: sorted(task.upstream_task_ids) for task_id, task in tasks.items()}
    assert upstream == {
        "orders.pin_epoch": [],
        "orders.snapshot": ["orders.pin_epoch"],
        "orders.catch_up": ["orders.pin_epoch", "orders.snapshot"],
        "orders.wait_caught_up": ["orders.catch_up"],
        "orders.forward": ["orders.pin_epoch", "orders.wait_caught_up"],
    }
    assert tasks["orders.catch_up"].trigger_rule == TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS
    assert tasks["orders.forward"].trigger_rule == TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS
    assert tasks["orders.pin_epoch"].trigger_rule == TriggerRule.NONE_FAILED
    epoch, reference = tasks["orders.snapshot"].epoch, tasks["orders.wait_caught_up"].reference_version
    assert isinstance(epoch, XComArg) and isinstance(reference, XComArg)
    assert (epoch.operator.task_id, epoch.key) == ("orders.pin_epoch", "pinned_epoch")
    assert (reference.operator.task_id, reference.key) == ("orders.catch_up", "handover_version")
    assert {tasks[t].conf_key for t in ("orders.pin_epoch", "orders.snapshot", "orders.forward")} == {"orders"}
    assert tasks["orders.forward"].max_epochs == 3
    for task_id in ("orders.snapshot", "orders.catch_up", "orders.forward"):
        assert tasks[task_id].outlets == [mv_asset(job)]
    assert tasks["orders.pin_epoch"].forward_task_id == "orders.forward"


def test_maintenance_runs_between_catch_up_and_the_wait(job):
    with DAG("m", schedule=None, start_date=pendulum.datetime(2026, 1, 1)) as dag:
        backfill_task_group(job, group_id="orders", maintenance=True)
    tasks = {task.task_id: task for task in dag.tasks}
    assert sorted(tasks["orders.maintain"].upstream_task_ids) == ["orders.catch_up"]
    # the wait also reads catch-up's hand-over version (an XComArg, so a dependency too)
    assert sorted(tasks["orders.wait_caught_up"].upstream_task_ids) == ["orders.catch_up", "orders.maintain"]
    assert tasks["orders.maintain"].trigger_rule == TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS
    assert tasks["orders.maintain"].application.endswith("maintain.py")


def test_maintenance_options_reach_the_maintain_task(job):
    with DAG("m", schedule=None, start_date=pendulum.datetime(2026, 1, 1)) as dag:
        backfill_task_group(job, group_id="orders", maintenance={"vacuum": True, "max_file_size": 1 << 20})
    maintain = next(task for task in dag.tasks if task.task_id == "orders.maintain")
    assert (maintain.vacuum, maintain.max_file_size) == (True, 1 << 20)
    with DAG("bad", schedule=None, start_date=pendulum.datetime(2026, 1, 1)):
        with pytest.raises(BackfillConfigError, match="max_file_size must be between 1 and .*, got 0"):
            backfill_task_group(job, group_id="orders", maintenance={"max_file_size": 0})


def test_the_catch_up_driver_jit_reaches_the_catch_up_task_only(job):
    with DAG("j", schedule=None, start_date=pendulum.datetime(2026, 1, 1)) as dag:
        backfill_task_group(job, group_id="orders")
        backfill_task_group(job, group_id="full", catch_up_driver_jit="full")
    tasks = {task.task_id: task for task in dag.tasks}
    assert (tasks["orders.catch_up"].driver_jit, tasks["full.catch_up"].driver_jit) == ("auto", "full")
    assert not hasattr(tasks["full.forward"], "driver_jit")
    with DAG("bad", schedule=None, start_date=pendulum.datetime(2026, 1, 1)):
        with pytest.raises(BackfillConfigError, match="driver_jit 'C1' is not one of auto, quick, full"):
            backfill_task_group(job, group_id="orders", catch_up_driver_jit="C1")


def test_an_mv_on_an_mv_starts_once_the_first_is_caught_up_not_after_its_forward(job, tmp_path):
    downstream = BackfillJob(name="totals", source=job.target, target=str(tmp_path / "totals"),
                             query="SELECT order_id, amount FROM source", primary_key=["order_id"])
    with DAG("chain", schedule=None, start_date=pendulum.datetime(2026, 1, 1)) as dag:
        first = backfill_task_group(job, group_id="orders")
        second = backfill_task_group(downstream, group_id="totals")
        caught_up(first) >> second
    tasks = {task.task_id: task for task in dag.tasks}
    assert tasks["totals.pin_epoch"].upstream_task_ids == {"orders.wait_caught_up"}
    assert tasks["orders.forward"].downstream_task_ids == set()
    with DAG("other", schedule=None, start_date=pendulum.datetime(2026, 1, 1)):
        with TaskGroup("plain") as plain:
            EmptyOperator(task_id="wait")
    with pytest.raises(TypeError, match="not a backfill task group"):
        caught_up(plain)


def test_mv_asset_is_the_target_uri(job):
    asset = mv_asset(job)
    assert asset.uri == f"file://{job.target}" and asset.name == asset.uri


def test_the_upstream_is_an_inlet_and_one_asset_with_the_mv_that_produces_it(job, tmp_path):
    """Airflow keeps asset names and URIs each unique: the first MV (an outlet) and the
    same table as the second job's upstream (an inlet) must be the very same asset."""
    downstream = BackfillJob(name="totals", source=job.target, target=str(tmp_path / "totals"),
                             query="SELECT order_id, amount FROM source", primary_key=["order_id"])
    with DAG("chain", schedule=None, start_date=pendulum.datetime(2026, 1, 1)) as dag:
        first = backfill_task_group(job, group_id="orders")
        caught_up(first) >> backfill_task_group(downstream, group_id="totals")
    for task_id in ("totals.snapshot", "totals.catch_up", "totals.forward"):
        assert dag.get_task(task_id).inlets == [mv_asset(job)]
    assert dag.get_task("orders.snapshot").inlets[0].uri == f"file://{job.source}"


def test_example_dags_import_without_errors(monkeypatch, tmp_path):
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("AIRFLOW_BACKFILL_HOME", str(tmp_path))
    bag = DagBag(dag_folder=str(ROOT / "dags"))
    assert bag.import_errors == {}
    assert {"example_orders_mv", "example_tpch_pricing_summary"} <= set(bag.dag_ids)
    orders_dag = bag.get_dag("example_orders_mv")
    assert orders_dag.params["forward_max_epochs"] == 3 and orders_dag.params["forward_idle_timeout"] == 30
    assert orders_dag.get_task("orders_mv.forward").max_epochs == "{{ params.forward_max_epochs }}"
    tpch_dag = bag.get_dag("example_tpch_pricing_summary")
    assert tpch_dag.get_task("linestatus_totals.pin_epoch").upstream_task_ids == {"pricing_summary.wait_caught_up"}


def test_example_dag_job_equals_the_yaml_job(monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW_BACKFILL_HOME", str(tmp_path))
    import importlib.util

    spec = importlib.util.spec_from_file_location("example_orders_mv", ROOT / "dags" / "example_orders_mv.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.ORDERS_MV == load_job(ROOT / "jobs" / "orders_mv.yaml")


def test_the_consistent_reads_example_declares_the_job_files_jobs(monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW_BACKFILL_HOME", str(tmp_path))
    import importlib.util

    path = ROOT / "dags" / "example_consistent_reads.py"
    spec = importlib.util.spec_from_file_location("example_consistent_reads", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for job in (module.ORDERS_MV, module.ORDER_STATUS_COUNTS, module.REVENUE_BY_CUSTOMER):
        assert job == load_job(ROOT / "jobs" / f"{job.name}.yaml")
    assert module.REVENUE_BY_CUSTOMER.source == module.ORDERS_MV.target


def test_provider_is_registered_under_the_distribution_name():
    info = get_provider_info()
    assert info["package-name"] == metadata("airflow-backfill")["Name"]
    assert "hook-class-names" not in info  # deprecated in provider info; hooks are listed by module
    registered = [ep for ep in entry_points(group="apache_airflow_provider") if ep.value.startswith("airflow_backfill")]
    assert len(registered) == 1 and registered[0].load()() == info


@pytest.mark.parametrize("kind", ["operators", "sensors", "triggers", "hooks"])
def test_provider_modules_import(kind):
    import importlib

    for entry in get_provider_info()[kind]:
        for module in entry["python-modules"]:
            importlib.import_module(module)


def test_an_optional_verify_task_checks_the_mv_after_it_caught_up(job):
    with DAG("v", schedule=None, start_date=pendulum.datetime(2026, 1, 1)) as dag:
        backfill_task_group(job, group_id="orders", verify=True)
    verify = dag.get_task("orders.verify")
    assert verify.upstream_task_ids == {"orders.wait_caught_up"}
    assert Path(verify.application).name == "verify.py" and Path(verify.application).is_file()
    assert verify.outlets == [] and verify.conf_key == "orders"
    with DAG("plain", schedule=None, start_date=pendulum.datetime(2026, 1, 1)) as plain:
        backfill_task_group(job, group_id="orders")
    assert "orders.verify" not in plain.task_ids
