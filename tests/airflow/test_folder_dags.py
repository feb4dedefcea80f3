"""A folder of job files as DAGs (`backfill_dags`), read by Airflow's own DagBag."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from airflow.dag_processing.dagbag import DagBag
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import Asset

from airflow_backfill.job_folder import load_job_folder
from airflow_backfill.operators.shared_forward import SharedForwardOperator

DAG_FILE = """
from airflow_backfill.folder_dags import backfill_dags

backfill_dags("../jobs"{arguments})
"""


def job_file(name: str, source: str, **fields: object) -> str:
    lines = [f"name: {name}", f"source: {source}", f"target: lake/{name}",
             "query: SELECT id, kind FROM source", "primary_key: [id]"]
    lines += [f"{key}: {value}" for key, value in fields.items()]
    return "\n".join(lines) + "\n"


KAFKA_FILE = """
upstream: {bootstrap_servers: "127.0.0.1:9092", topic: orders, value_schema: "id BIGINT, kind STRING"}
source_job: {name: orders_source, table: lake/orders_topic}
backfill: {name: topic_mv, target: lake/topic_mv, query: "SELECT id, kind FROM source"}
"""


def make_folder(root: Path, jobs: dict[str, str], arguments: str = "") -> Path:
    (root / "jobs").mkdir()
    (root / "dags").mkdir()
    for file_name, text in jobs.items():
        (root / "jobs" / file_name).write_text(text)
    (root / "dags" / "jobs_dag.py").write_text(DAG_FILE.format(arguments=arguments))
    return root


def bag_of(root: Path) -> DagBag:
    return DagBag(dag_folder=str(root / "dags"))


@pytest.fixture
def elsewhere(tmp_path_factory, monkeypatch):
    """Parse from an unrelated working directory: paths must not depend on it."""
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


def test_each_job_file_becomes_a_dag_and_mvs_over_mvs_wait_for_their_backfill(tmp_path, elsewhere):
    root = make_folder(tmp_path, {
        "orders_mv.yaml": job_file("orders_mv", "lake/orders"),
        "orders_big.yaml": job_file("orders_big", "lake/orders_mv"),
        "joined.yaml": "\n".join([
            "name: joined", "target: lake/joined",
            "sources:", "  a: {table: lake/orders_mv, primary_key: [id]}",
            "  b: {table: lake/orders_big, primary_key: [id]}",
            "query: SELECT a.id, b.kind FROM a JOIN b ON a.id = b.id",
        ]) + "\n",
    }, arguments=', backfill="per_job"')
    bag = bag_of(root)
    assert bag.import_errors == {}
    assert sorted(bag.dags) == ["joined", "orders_big", "orders_mv", "shared_forward"]
    assert sorted(dag.dag_id for dag in parse_as_the_dag_processor(root).serialized_dags) == sorted(bag.dags)
    lake = (root / "jobs" / "lake").resolve()

    def ready(name: str) -> Asset:
        uri = f"file://{lake / name}/_airflow_backfill/caught_up"
        return Asset(name=uri, uri=uri)

    root_dag, over_mv, join = bag.dags["orders_mv"], bag.dags["orders_big"], bag.dags["joined"]
    assert type(root_dag.timetable).__name__ == "OnceTimetable"
    assert over_mv.timetable.asset_condition == ready("orders_mv")
    assert set(join.timetable.asset_condition.objects) == {ready("orders_mv"), ready("orders_big")}
    assert type(join.timetable.asset_condition).__name__ == "AssetAll"
    # Relative table paths resolve against the folder, not the working directory.
    assert over_mv.get_task("orders_big.snapshot").job.source == str(lake / "orders_mv")
    # The shared forward ends the backfills: each DAG ends at `ready`, which emits the MV's
    # caught-up asset, and pin_epoch routes there when the MV is already fresh.
    tasks = {task.task_id: task for task in root_dag.tasks}
    assert "orders_mv.forward" not in tasks
    assert isinstance(tasks["orders_mv.ready"], EmptyOperator)
    assert tasks["orders_mv.ready"].outlets == [ready("orders_mv")]
    assert tasks["orders_mv.pin_epoch"].forward_task_id == "orders_mv.ready"
    assert sorted(tasks["orders_mv.ready"].upstream_task_ids) == ["orders_mv.pin_epoch", "orders_mv.wait_caught_up"]
    forward = bag.dags["shared_forward"].get_task("forward")
    assert isinstance(forward, SharedForwardOperator)
    assert forward.folder == str((root / "jobs").resolve())
    assert not forward.backfill


def test_by_default_the_shared_forward_backfills_the_folder_and_each_dag_follows_its_mv(tmp_path, elsewhere):
    from airflow_backfill.operators.mv_ready import MvReadyOperator
    from airflow_backfill.sensors.lag import CaughtUpSensor

    root = make_folder(tmp_path, {"orders_mv.yaml": job_file("orders_mv", "lake/orders"),
                                  "orders_big.yaml": job_file("orders_big", "lake/orders_mv")},
                       arguments=", backfill_workers=3, sensor_timeout=600, verify=True")
    bag = bag_of(root)
    assert bag.import_errors == {}
    assert sorted(dag.dag_id for dag in parse_as_the_dag_processor(root).serialized_dags) == sorted(bag.dags)
    forward = bag.dags["shared_forward"].get_task("forward")
    assert forward.backfill and forward.backfill_workers == 3
    tasks = {task.task_id: task for task in bag.dags["orders_big"].tasks}
    assert sorted(tasks) == ["orders_big.ready", "orders_big.wait_caught_up"]  # no phase task of its own
    assert isinstance(tasks["orders_big.wait_caught_up"], CaughtUpSensor)
    assert tasks["orders_big.wait_caught_up"].timeout == 600
    assert isinstance(tasks["orders_big.ready"], MvReadyOperator)
    lake = (root / "jobs" / "lake").resolve()
    assert {asset.uri for asset in tasks["orders_big.ready"].outlets} == {
        f"file://{lake / 'orders_big'}", f"file://{lake / 'orders_big'}/_airflow_backfill/caught_up"}


@pytest.mark.parametrize(("arguments", "message"), [
    (', forward="task", backfill="folder"', "runs in the shared forward's application"),
    (', backfill="together"', "backfill must be 'folder' or 'per_job'"),
    (", backfill_workers=0", "backfill_workers must be between 1 and 64"),
])
def test_a_bad_backfill_shape_is_an_import_error_naming_the_fix(tmp_path, elsewhere, arguments, message):
    root = make_folder(tmp_path, {"orders_mv.yaml": job_file("orders_mv", "lake/orders")}, arguments=arguments)
    (error,) = bag_of(root).import_errors.values()
    assert message in error


def parse_as_the_dag_processor(root: Path):
    """What Airflow's DAG processor records for the DAG file: its serialized DAGs and its
    import errors, keyed by path relative to the bundle (the DAG folder)."""
    import structlog
    from airflow.dag_processing.processor import DagFileParseRequest, _parse_file

    request = DagFileParseRequest(file=str(root / "dags" / "jobs_dag.py"), bundle_path=root / "dags",
                                  bundle_name="dags-folder", callback_requests=[])
    return _parse_file(request, structlog.get_logger())


def test_a_bad_job_file_is_an_import_error_of_its_own_naming_the_field_and_hides_no_other_dag(tmp_path, elsewhere):
    root = make_folder(tmp_path, {
        "good.yaml": job_file("good", "lake/orders"),
        "bad.yaml": job_file("bad", "lake/orders", parallelism=0),
        "also_bad.yaml": "name: also_bad\nsource: lake/orders\ntarget: lake/x\nprimary_key: [id]\n",
        "same_name.yaml": job_file("good", "lake/other").replace("lake/good", "lake/good2"),
        "windowed.yaml": job_file("windowed", "lake/orders").replace(
            "SELECT id, kind FROM source", "SELECT id, rank() OVER (ORDER BY kind) AS r FROM source"),
    })
    parsed = parse_as_the_dag_processor(root)
    assert sorted(dag.dag_id for dag in parsed.serialized_dags) == ["good", "shared_forward"]
    # Each error belongs to its job file, not to the DAG file: Airflow marks every DAG of
    # a file with an import error stale, and the DAG file's DAGs must stay.
    assert sorted(parsed.import_errors) == ["../jobs/also_bad.yaml", "../jobs/bad.yaml", "../jobs/same_name.yaml",
                                            "../jobs/windowed.yaml"]
    jobs = (root / "jobs").resolve()
    errors = parsed.import_errors
    assert f"job file {jobs / 'bad.yaml'}: parallelism must be between 1 and 1024, got 0" in errors["../jobs/bad.yaml"]
    assert f"job file {jobs / 'also_bad.yaml'}: missing required field(s) query" in errors["../jobs/also_bad.yaml"]
    assert "name 'good' is already the name of the job in" in errors["../jobs/same_name.yaml"]
    assert (f"job file {jobs / 'windowed.yaml'}: window functions (OVER ...) are not supported"
            in errors["../jobs/windowed.yaml"])
    assert bag_of(root).import_errors == {}  # parsing alone (a worker running a task) is not disturbed


def test_mvs_reading_each_other_in_a_cycle_are_refused(tmp_path):
    root = make_folder(tmp_path, {
        "a.yaml": job_file("a", "lake/b"), "b.yaml": job_file("b", "lake/a"), "c.yaml": job_file("c", "lake/a"),
    })
    loaded = load_job_folder(root / "jobs")
    assert [entry.name for entry in loaded.jobs] == ["c"]
    assert sorted(Path(error.path).name for error in loaded.errors) == ["a.yaml", "b.yaml"]
    assert all("read each other in a cycle" in error.message for error in loaded.errors)


def test_forward_task_keeps_a_forward_per_job(tmp_path, elsewhere):
    root = make_folder(tmp_path, {"orders_mv.yaml": job_file("orders_mv", "lake/orders")},
                       arguments=', forward="task", dag_id_prefix="lake_", default_args={"retries": 2}')
    bag = bag_of(root)
    assert sorted(bag.dags) == ["lake_orders_mv"]
    dag = bag.dags["lake_orders_mv"]
    assert {task.retries for task in dag.tasks} == {2}
    assert dag.get_task("orders_mv.forward").upstream_task_ids == {"orders_mv.ready"}
    assert dag.get_task("orders_mv.pin_epoch").forward_task_id == "orders_mv.ready"


def test_a_kafka_pipeline_in_the_folder_feeds_the_mvs_over_it(tmp_path, elsewhere):
    root = make_folder(tmp_path, {"topic.yaml": KAFKA_FILE, "over_topic.yaml": job_file("over_topic", "lake/topic_mv")})
    bag = bag_of(root)
    assert bag.import_errors == {}
    kafka = bag.dags["topic_mv"]
    # The shared forward runs the source job, so the backfill has no source_job task.
    assert sorted(task.task_id for task in kafka.tasks) == ["topic_mv.source_backfill", "topic_mv.wait_finished"]
    uri = f"file://{(root / 'jobs' / 'lake' / 'topic_mv').resolve()}/_airflow_backfill/caught_up"
    assert kafka.get_task("topic_mv.wait_finished").outlets == [Asset(name=uri, uri=uri)]
    assert bag.dags["over_topic"].timetable.asset_condition == Asset(name=uri, uri=uri)


def test_a_missing_folder_is_an_import_error_naming_it(tmp_path):
    (tmp_path / "dags").mkdir()
    (tmp_path / "dags" / "jobs_dag.py").write_text(DAG_FILE.format(arguments=""))
    bag = bag_of(tmp_path)
    assert bag.dags == {}
    (error,) = bag.import_errors.values()
    assert f"job folder {os.path.realpath(tmp_path / 'jobs')} does not exist" in error


@pytest.mark.parametrize(("driver_jit", "user_conf", "expected"), [
    (None, {}, "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"),
    ("full", {}, None),
    ("quick", {"spark.driver.extraJavaOptions": "-XX:-TieredCompilation"}, None),
])
def test_the_shared_forward_driver_starts_with_the_quick_jit_unless_told_otherwise(
        tmp_path, monkeypatch, driver_jit, user_conf, expected):
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    monkeypatch.setenv("AIRFLOW_BACKFILL_JVM_ARCHIVE", "off")
    submitted: list[dict] = []
    monkeypatch.setattr(SparkSubmitOperator, "execute", lambda operator, context: submitted.append(dict(operator.conf)))
    chosen = {} if driver_jit is None else {"driver_jit": driver_jit}
    SharedForwardOperator(task_id="forward", folder=str(tmp_path), conf=user_conf, **chosen).execute({})
    (conf,) = submitted
    assert conf.get("spark.driver.defaultJavaOptions") == expected
    assert conf.get("spark.driver.extraJavaOptions") == user_conf.get("spark.driver.extraJavaOptions")


@pytest.mark.parametrize(("field", "value"), [("workers", 0), ("workers", "2"), ("backfill_workers", 65),
                                              ("poll_interval", -1),
                                              ("stop_timeout", True), ("driver_jit", "auto")])
def test_the_shared_forward_refuses_bad_settings_where_they_enter(tmp_path, field, value):
    from airflow_backfill.exceptions import BackfillConfigError

    with pytest.raises(BackfillConfigError, match=field):
        SharedForwardOperator(task_id="forward", folder=str(tmp_path), **{field: value})


CONSUMER_FILE = """
import pendulum
from airflow.sdk import DAG
from airflow.providers.standard.operators.empty import EmptyOperator

from airflow_backfill.folder_dags import folder_mv_asset

with DAG("orders_consumer", schedule=[folder_mv_asset("../jobs", "orders_mv")],
         start_date=pendulum.datetime(2026, 1, 1)):
    EmptyOperator(task_id="read")
"""


def test_every_mv_asset_carries_the_mvs_watcher_wherever_airflow_collects_it(tmp_path, elsewhere):
    """Airflow runs an asset's watchers while an unpaused DAG is scheduled on it, taking them
    from each DAG file that names the asset, the last mention in a file winning: every
    mention, the folder's inlets of a job over the MV included, must carry the same
    watcher as a consumer's schedule on the MV, or each parse would swap them."""
    from airflow.dag_processing.collection import AssetModelOperation
    from airflow.triggers.base import BaseEventTrigger

    root = make_folder(tmp_path, {"orders_mv.yaml": job_file("orders_mv", "lake/orders"),
                                  "orders_big.yaml": job_file("orders_big", "lake/orders_mv")})
    (root / "dags" / "consumer.py").write_text(CONSUMER_FILE)
    bag = bag_of(root)
    assert bag.import_errors == {}
    lake = (root / "jobs" / "lake").resolve()
    kwargs = {"job": "orders_mv", "source": str(lake / "orders"), "target": str(lake / "orders_mv"),
              "app_id": "airflow_backfill/orders_mv", "poll_interval": 2.0, "min_interval": 10.0,
              "aws_conn_id": None}
    uri = f"file://{lake / 'orders_mv'}"
    mentions = [asset for dag in bag.dags.values() for task in dag.tasks for asset in (*task.inlets, *task.outlets)
                if asset.name == uri]
    mentions += list(bag.dags["orders_consumer"].timetable.asset_condition.objects)
    assert {type(asset).__name__ for asset in mentions} == {"Asset"}
    tasks = {(dag.dag_id, task.task_id) for dag in bag.dags.values() for task in dag.tasks
             if any(asset.name == uri for asset in (*task.inlets, *task.outlets))}
    assert {("orders_mv", "orders_mv.ready"), ("orders_big", "orders_big.ready")} <= tasks
    for asset in mentions:
        (watcher,) = asset.watchers
        assert watcher.trigger.serialize() == ("airflow_backfill.triggers.mv_commits.MvCommitsTrigger", kwargs)
    # What the DAG processor registers from the folder's file: the same trigger (by the hash
    # Airflow compares), so the consumer's file and the folder's agree.
    parsed = parse_as_the_dag_processor(root)
    collected = AssetModelOperation.collect({dag.dag_id: dag for dag in parsed.serialized_dags}).assets
    (registered,) = collected[(uri, uri)].watchers
    classpath, _ = watcher.trigger.serialize()
    assert registered.name == "orders_mv_commits"
    assert BaseEventTrigger.hash(registered.trigger["classpath"], registered.trigger["kwargs"]) == \
        BaseEventTrigger.hash(classpath, kwargs)
    # The upstream stays a plain asset: a base table has no watcher.
    assert bag.dags["orders_mv"].get_task("orders_mv.ready").inlets[0].watchers == []


def test_a_consumer_names_a_folder_mv_by_its_job_name(tmp_path, elsewhere):
    from airflow_backfill.exceptions import BackfillConfigError
    from airflow_backfill.folder_dags import folder_mv_asset

    root = make_folder(tmp_path, {"orders_mv.yaml": job_file("orders_mv", "lake/orders")})
    uri = f"file://{(root / 'jobs' / 'lake' / 'orders_mv').resolve()}"
    asset = folder_mv_asset(root / "jobs", "orders_mv")
    assert (asset.name, asset.uri) == (uri, uri) and len(asset.watchers) == 1
    with pytest.raises(BackfillConfigError, match="has no Delta job named 'orders' .its Delta jobs: orders_mv."):
        folder_mv_asset(root / "jobs", "orders")
