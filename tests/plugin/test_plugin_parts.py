"""The plugin's parts without a server: registration through the provider info, the job
in the serialized DAG (the only way the API server learns of jobs), the registry that
decodes a DAG only when it changed, the alter body, and the lag history."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import subprocess
import sys

import pendulum
import pytest
from airflow.sdk import DAG
from airflow.serialization.serialized_objects import DagSerialization

from airflow_backfill.engine.lag_history import CommitTimes, lag_history, latest_version_at
from airflow_backfill.get_provider_info import get_provider_info
from airflow_backfill.job import BackfillJob
from airflow_backfill.plugins.api import AlterRequestError, parse_alter_body
from airflow_backfill.plugins.jobs import JobRegistry, JobTask, index_jobs, jobs_in_serialized_dag
from airflow_backfill.plugins.page import PAGE_SCRIPT
from airflow_backfill.task_group import backfill_task_group


def make_job(name: str, root: str, query: str = "SELECT order_id, amount FROM source") -> BackfillJob:
    return BackfillJob(name=name, source=f"{root}/{name}_source", target=f"{root}/{name}", query=query,
                       primary_key=["order_id"])


def make_dag(dag_id: str, *jobs: BackfillJob) -> DAG:
    with DAG(dag_id, schedule=None, start_date=pendulum.datetime(2026, 1, 1)) as dag:
        for index, job in enumerate(jobs):
            backfill_task_group(job, group_id=f"group_{index}")
    return dag


def serialized(dag: DAG) -> dict:
    """What the DAG processor stores, through JSON as the database holds it."""
    return json.loads(json.dumps(DagSerialization.to_dict(dag)))


def test_the_entry_point_registers_the_plugin_and_the_provider_info_the_link():
    [entry_point] = [point for point in importlib.metadata.entry_points(group="airflow.plugins")
                     if point.dist is not None and point.dist.name == "airflow-backfill"]
    plugin_class = entry_point.load()
    assert plugin_class.name == entry_point.name == "airflow_backfill"
    # Not in the provider info too: with eager discovery Airflow would load it twice.
    info = get_provider_info()
    assert "plugins" not in info
    assert [app["url_prefix"] for app in plugin_class.fastapi_apps] == ["/airflow-backfill"]
    [react_app] = plugin_class.react_apps
    assert react_app["bundle_url"] == "airflow-backfill/static/backfill_progress.js" and PAGE_SCRIPT.is_file()
    for link in info["extra-links"]:
        module, _, name = link.rpartition(".")
        assert getattr(importlib.import_module(module), name)().name == "Backfill progress"


@pytest.mark.parametrize("lazy", ["True", "False"])
def test_airflow_loads_the_plugin_once_whatever_provider_discovery_does(lazy, tmp_path):
    # Run away from the checkout: `python -c` puts the working folder on sys.path, and the
    # editable install's `airflow_backfill.egg-info` there would name the plugin twice.
    env = {**os.environ, "AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS": lazy}
    probe = ("import json; from airflow import plugins_manager as m; plugins, errors = m._get_plugins(); "
             "print(json.dumps({'names': [p.name for p in plugins], 'errors': errors}))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                                       timeout=120, check=True, cwd=tmp_path).stdout.strip().splitlines()[-1])
    assert loaded["names"].count("airflow_backfill") == 1
    # (The OpenLineage provider registers its plugin both ways: with eager discovery Airflow
    # reports its second load as an import error, which this provider avoids.)
    assert {source: error for source, error in loaded["errors"].items()
            if "backfill" in f"{source} {error}".lower()} == {}
    result = subprocess.run([sys.executable, "-m", "airflow", "plugins", "--output", "json"], env=env,
                            capture_output=True, text=True, timeout=120, check=True, cwd=tmp_path)
    plugins = {plugin["name"]: plugin for plugin in json.loads(result.stdout)}
    assert "/airflow-backfill" in str(plugins["airflow_backfill"]["fastapi_apps"])
    assert "'url_route': 'airflow-backfill'" in str(plugins["airflow_backfill"]["react_apps"])


def test_every_task_of_a_backfill_group_carries_its_job_in_the_serialized_dag(tmp_path):
    job = make_job("orders_mv", str(tmp_path))
    data = serialized(make_dag("backfill", job))
    found = jobs_in_serialized_dag("backfill", data)
    assert {found_job for found_job, _ in found} == {job}
    assert sorted(task.task_type for _, task in found) == [
        "CaughtUpSensor", "ForwardOperator", "LogStoreCatchUpOperator", "PinEpochOperator",
        "SnapshotBackfillOperator",
    ]
    assert {task.task_id for _, task in found} >= {"group_0.snapshot", "group_0.forward"}
    # The scheduler and the API server read the same record back as before.
    assert len(DagSerialization.from_dict(data).tasks) == 5


def test_a_serialized_job_that_does_not_load_is_left_out(tmp_path, caplog):
    data = serialized(make_dag("backfill", make_job("orders_mv", str(tmp_path))))
    data["dag"]["tasks"][0]["__var"]["backfill_job"] = json.dumps({"name": "broken"})
    assert len(jobs_in_serialized_dag("backfill", data)) == 4
    assert "carries a job the UI cannot read" in caplog.text


def test_jobs_are_indexed_by_name_with_every_dag_that_declares_them(tmp_path):
    first, second = make_job("orders_mv", str(tmp_path)), make_job("totals_mv", str(tmp_path))
    declared = [*jobs_in_serialized_dag("backfill_b", serialized(make_dag("backfill_b", first, second))),
                *jobs_in_serialized_dag("backfill_a", serialized(make_dag("backfill_a", first)))]
    jobs = index_jobs(declared)
    assert list(jobs) == ["orders_mv", "totals_mv"]
    assert jobs["orders_mv"].dag_ids == ("backfill_a", "backfill_b") and jobs["orders_mv"].job == first
    assert jobs["totals_mv"].dag_ids == ("backfill_b",)
    assert len(jobs["orders_mv"].tasks) == 10


def test_a_different_job_under_a_known_name_is_left_out(tmp_path, caplog):
    first = make_job("orders_mv", str(tmp_path))
    other = make_job("orders_mv", str(tmp_path), query="SELECT order_id FROM source")
    jobs = index_jobs([(first, JobTask("a", "t", "ForwardOperator")), (other, JobTask("b", "t", "ForwardOperator"))])
    assert jobs["orders_mv"].job == first and jobs["orders_mv"].dag_ids == ("a",)
    assert "differs from another DAG's job" in caplog.text


class FakeDatabase:
    """Serialized DAGs by id, with the number of DAGs decoded."""

    def __init__(self, dags: dict[str, tuple[str, dict]]) -> None:
        self.dags = dags
        self.loads: list[str] = []

    def versions(self) -> dict[str, str]:
        return {dag_id: version for dag_id, (version, _) in self.dags.items()}

    def load(self, dag_id: str) -> dict:
        self.loads.append(dag_id)
        return self.dags[dag_id][1]


def test_the_registry_decodes_a_dag_only_when_it_changed(tmp_path):
    job = make_job("orders_mv", str(tmp_path))
    plain = {"dag": {"tasks": [{"__var": {"task_id": "nothing"}, "__type": "operator"}]}}
    database = FakeDatabase({"backfill": ("1:a", serialized(make_dag("backfill", job))),
                             **{f"plain_{index}": ("1:a", plain) for index in range(50)}})
    now = [0.0]
    registry = JobRegistry(database, ttl=5, clock=lambda: now[0])
    assert registry.get("orders_mv").job == job and len(database.loads) == 51
    now[0] = 4.9
    assert registry.get("orders_mv") is not None and len(database.loads) == 51
    now[0] = 5.0
    assert registry.get("orders_mv") is not None and len(database.loads) == 51  # nothing changed
    renamed = make_job("orders_v2", str(tmp_path))
    database.dags["backfill"] = ("1:b", serialized(make_dag("backfill", renamed)))
    del database.dags["plain_0"]
    now[0] = 10.0
    assert registry.get("orders_mv") is None and registry.get("orders_v2").job == renamed
    assert database.loads[51:] == ["backfill"]


@pytest.mark.parametrize(("body", "expected"), [
    ({"backfill_parallelism": 3}, ({"backfill_parallelism": 3}, None)),
    ({"rate_limit": None}, ({"rate_limit": None}, None)),
    ({"rate_limit": 0}, ({"rate_limit": 0}, None)),
    ({"resume": True}, ({}, "resume")),
    ({"reset": True}, ({}, "reset")),
])
def test_alter_bodies(body, expected):
    assert parse_alter_body(body) == expected


@pytest.mark.parametrize(("body", "message"), [
    ({"resume": True, "rate_limit": 5}, "resume cannot be combined with rate_limit"),
    ({"resume": True, "reset": True}, "send reset or resume, not both"),
    ({"resume": False}, "resume can only be true"),
    ({"rate_limit": "1,000"}, "rate_limit must be an integer"),
    ({"backfill_parallelism": ""}, "backfill_parallelism must be an integer"),
    ({"backfill_parallelism": None}, "backfill_parallelism must be an integer"),
    ({"rate_limit": -1}, "rate_limit must be between 1 and"),
])
def test_refused_alter_bodies(body, message):
    with pytest.raises(AlterRequestError, match=message):
        parse_alter_body(body)


TIMES = {version: 1_000_000 + 10_000 * version for version in range(11)}
"""Upstream commit times (ms): one version every 10 s."""


def test_the_latest_version_at_a_time_is_found_by_bisection():
    reads: list[int] = []

    def timestamp_of(_uri: str, version: int) -> int:
        reads.append(version)
        return TIMES[version]

    assert latest_version_at("up", TIMES[7] + 5_000, 2, 10, timestamp_of) == 7
    assert latest_version_at("up", TIMES[10], 2, 10, timestamp_of) == 10
    assert latest_version_at("up", TIMES[2] - 1, 2, 10, timestamp_of) is None
    assert len(reads) <= 12


def test_the_lag_history_has_one_point_per_phase_commit():
    commits = [  # newest first, as the status lists them
        {"version": 3, "timestamp": TIMES[9] + 1_000, "phase": "forward", "epoch": 9},
        {"version": 2, "timestamp": TIMES[8] + 500, "phase": "catch_up", "epoch": 6},
        {"version": 1, "timestamp": TIMES[5] + 500, "phase": "snapshot", "epoch": 2},
        {"version": 0, "timestamp": TIMES[3], "phase": None, "epoch": 2},  # a snapshot chunk
    ]
    times = CommitTimes(read=lambda _uri, version: TIMES[version])
    points = lag_history("up", commits, 10, times)
    assert [(point.mv_version, point.epochs, point.seconds) for point in points] == [
        (1, 3, 30.0), (2, 2, 20.0), (3, 0, 0.0),
    ]
    assert points[0].at == (TIMES[5] + 500) / 1000
    assert lag_history("up", commits, None, times) == []


KAFKA_PIPELINE = {
    "upstream": {"bootstrap_servers": "127.0.0.1:9092", "topic": "orders", "value_schema": "id BIGINT, kind STRING"},
    "source_job": {"name": "orders_source", "table": "/lake/orders_topic"},
    "backfill": {"name": "topic_mv", "target": "/lake/topic_mv", "query": "SELECT id, kind FROM source"},
}


def test_kafka_pipelines_are_listed_from_the_serialized_dag_beside_the_jobs(tmp_path):
    from airflow_backfill.kafka.config import KafkaPipeline
    from airflow_backfill.kafka_task_group import kafka_backfill_task_group

    pipeline = KafkaPipeline.from_mapping(KAFKA_PIPELINE)
    with DAG("kafka", schedule=None, start_date=pendulum.datetime(2026, 1, 1)) as dag:
        kafka_backfill_task_group(pipeline)
    job = make_job("orders_mv", str(tmp_path))

    class Database:
        def versions(self):
            return {"kafka": "1", "delta": "1"}

        def load(self, dag_id):
            return serialized(dag) if dag_id == "kafka" else serialized(make_dag("delta", job))

    registry = JobRegistry(Database())
    assert list(registry.jobs()) == ["orders_mv"]
    (known,) = registry.pipelines().values()
    assert known.pipeline == pipeline and known.dag_ids == ("kafka",)
    assert sorted(task.task_type for task in known.tasks) == ["KafkaSourceBackfillOperator", "KafkaSourceJobOperator"]
    text = json.dumps(serialized(dag))
    assert "bootstrap" in text and "password" not in text  # the connection's id or servers, never a secret


def test_summaries_and_pipeline_views_read_only_the_delta_logs(tmp_path):
    """A job and a pipeline that never ran: the list's rows say so without a server error."""
    from airflow_backfill.kafka.config import KafkaPipeline
    from airflow_backfill.plugins.api import SUMMARY_STATUS_FIELDS, job_summary, pipeline_view
    from airflow_backfill.plugins.jobs import KnownJob, KnownPipeline

    mapping = json.loads(json.dumps(KAFKA_PIPELINE).replace("/lake", str(tmp_path)))
    view = pipeline_view(KnownPipeline(KafkaPipeline.from_mapping(mapping), ("kafka",)))
    assert (view["kind"], view["splits"], view["status"]["phase"], view["status"]["source_job_running"]) == (
        "kafka", [], None, False)
    job = make_job("orders_mv", str(tmp_path))
    summary = job_summary(KnownJob(job, ("delta",)), can_edit=True)
    assert summary["summary"] is True and summary["kind"] == "delta"
    assert summary["error"] or set(summary["status"]) == {*SUMMARY_STATUS_FIELDS, "paused"}


def test_the_provider_info_lists_every_module_with_a_public_operator_sensor_trigger_or_hook():
    """Airflow's provider listing and docs read these lists: a new module left out of them
    is missing from `airflow providers` output."""
    import inspect
    import pkgutil

    from airflow.sdk import BaseHook, BaseOperator
    from airflow.triggers.base import BaseTrigger

    import airflow_backfill

    info = get_provider_info()
    kinds = {"operators": BaseOperator, "sensors": BaseOperator, "triggers": BaseTrigger, "hooks": BaseHook}
    for kind, base in kinds.items():
        listed = {module for entry in info[kind] for module in entry["python-modules"]}
        package = importlib.import_module(f"airflow_backfill.{kind}")
        classes = set()
        for found in pkgutil.iter_modules(package.__path__, f"{airflow_backfill.__name__}.{kind}."):
            module = importlib.import_module(found.name)
            classes |= {value for name, value in vars(module).items() if inspect.isclass(value)
                        and issubclass(value, base) and value.__module__ == module.__name__
                        and not name.startswith("_") and not inspect.isabstract(value)}
        usable = {cls for cls in classes if not any(other is not cls and issubclass(other, cls) for other in classes)}
        assert usable, kind  # the test sees the package's classes
        defining = {cls.__module__ for cls in usable}
        assert defining <= listed, (kind, sorted(defining - listed))


def test_a_folder_backfills_error_marks_the_job_failing_in_the_list(tmp_path):
    """The shared forward's folder backfill records its last error in the MV's state file;
    the list's row carries it beside the forward's (the page shows the job as failing)."""
    from airflow_backfill.engine import job_state
    from airflow_backfill.plugins.api import job_summary, job_view
    from airflow_backfill.plugins.jobs import KnownJob

    job = BackfillJob(name="orders_mv", source=str(tmp_path / "orders"), target=str(tmp_path / "orders_mv"),
                      query="SELECT order_id, amount FROM source", primary_key=("order_id",))
    job_state.update_state(job.target, backfill_error="snapshot: the upstream is gone")
    known = KnownJob(job, ("orders_mv",))
    for view in (job_summary(known, can_edit=False), job_view(known, can_edit=False)):
        assert view["backfill_error"] == "snapshot: the upstream is gone" and view["forward_error"] is None, view
    assert "view.backfill_error" in PAGE_SCRIPT.read_text()  # the row's phase and detail show it
