"""The phase operators hand spark-submit the right application and arguments, and push
the watermark they read back from the Delta log."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pytest
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from conftest import commit_upstream_versions, context_with
from deltalake import write_deltalake
from helpers_delta import write_mv_version
from size_overrides import set_sizes

from airflow_backfill.exceptions import BackfillConfigError
from airflow_backfill.job import BackfillJob, load_job
from airflow_backfill.operators.phases import (
    ForwardOperator,
    LogStoreCatchUpOperator,
    SnapshotBackfillOperator,
)

PROGRESS_LINK = {"_link_BackfillProgressLink": "/plugin/airflow-backfill/jobs/orders_mv"}
"""Pushed when a phase starts, so a running phase already links to its job's page."""
MV_ROWS = pa.table({"order_id": pa.array([0], pa.int64()), "amount": pa.array([0.0])})


@pytest.fixture
def submitted(monkeypatch, tmp_path):
    """Replace the actual spark-submit with a recorder that commits like a phase would;
    the task logs (and the job files beside them) go to `tmp_path / "logs"`."""
    monkeypatch.setenv("AIRFLOW__LOGGING__BASE_LOG_FOLDER", str(tmp_path / "logs"))
    calls: list[dict] = []

    def fake_execute(operator, context):
        calls.append({"application": operator.application, "args": list(operator.application_args),
                      "conf": dict(operator.conf), "env": dict(operator.env_vars or {})})
        write_mv_version(operator.job.target, MV_ROWS, operator.job.app_id, watermark=7)

    monkeypatch.setattr(SparkSubmitOperator, "execute", fake_execute)
    return calls


def decoded_job(args: list[str]) -> BackfillJob:
    """The job the entry point reads: the file `--job` names, as it loads any job file."""
    path = Path(args[args.index("--job") + 1])
    assert path.is_absolute() and path.parent.parts[-3:] == ("logs", "airflow_backfill", "jobs"), path
    return load_job(path)


def test_snapshot_submits_its_entry_point_with_the_pinned_epoch(job, submitted):
    operator = SnapshotBackfillOperator(task_id="snapshot", job=job, epoch="5")
    context = context_with()
    operator.execute(context)
    call = submitted[0]
    assert os.path.basename(call["application"]) == "snapshot.py" and os.path.isfile(call["application"])
    assert call["args"][call["args"].index("--epoch") + 1] == "5"
    assert call["args"][call["args"].index("--parallelism") + 1] == str(job.backfill_parallelism)
    assert call["conf"]["spark.sql.shuffle.partitions"] == str(job.backfill_parallelism)
    assert decoded_job(call["args"]) == job
    assert context["ti"].pushed == {"snapshot_epoch": 7, **PROGRESS_LINK}


def test_unrendered_epoch_means_latest(job, submitted):
    SnapshotBackfillOperator(task_id="snapshot", job=job, epoch="None").execute(context_with())
    assert "--epoch" not in submitted[0]["args"]


def test_catch_up_uses_conf_overrides_and_pushes_the_handover(job, submitted):
    context = context_with({"backfill_parallelism": 3})
    LogStoreCatchUpOperator(task_id="catch_up", job=job).execute(context)
    args = submitted[0]["args"]
    assert args[args.index("--parallelism") + 1] == "3"
    assert decoded_job(args).backfill_parallelism == 3
    assert context["ti"].pushed == {"caught_up_epoch": 7, "handover_version": 7, **PROGRESS_LINK}


def test_the_job_file_is_named_by_its_content_and_nothing_in_the_arguments_looks_like_a_jwt(job, submitted):
    """Airflow masks log text starting with `eyJ`; a rerun of the same job reuses its file,
    a run with overrides gets another, and neither rewrites the first."""
    for conf in ({}, {}, {"backfill_parallelism": 3}):
        LogStoreCatchUpOperator(task_id="catch_up", job=job).execute(context_with(conf))
    paths = [call["args"][call["args"].index("--job") + 1] for call in submitted]
    assert paths[0] == paths[1] != paths[2]
    assert decoded_job(submitted[0]["args"]) == job and decoded_job(submitted[2]["args"]).backfill_parallelism == 3
    assert len(list(Path(paths[0]).parent.iterdir())) == 2  # no partial file left behind
    assert not any("eyJ" in argument for call in submitted for argument in call["args"])


def test_forward_runs_at_the_normal_parallelism_with_bounds(job, submitted):
    context = context_with({"forward_idle_timeout": 9})
    ForwardOperator(task_id="forward", job=job, max_epochs="3", idle_timeout="30").execute(context)
    args = submitted[0]["args"]
    assert args[args.index("--parallelism") + 1] == str(job.parallelism)
    assert args[args.index("--max-epochs") + 1] == "3"
    assert args[args.index("--idle-timeout") + 1] == "9.0"
    assert context["ti"].pushed == {"forward_epoch": 7, **PROGRESS_LINK}


def test_invalid_conf_fails_before_spark_submit(job, submitted):
    with pytest.raises(BackfillConfigError, match="must be between 1 and"):
        ForwardOperator(task_id="forward", job=job).execute(context_with({"parallelism": 0}))
    assert submitted == []


def test_cluster_master_sizes_executors_before_submit(job, submitted, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CLUSTER", "spark://spark-master:7077?deploy-mode=client")
    operator = SnapshotBackfillOperator(task_id="snapshot", job=job.with_overrides(backfill_parallelism=6),
                                        conn_id="spark_cluster", conf={"spark.executor.cores": "4"})
    operator.execute(context_with())
    conf = submitted[0]["conf"]
    assert (conf["spark.executor.instances"], conf["spark.executor.cores"]) == ("2", "3")
    assert conf["spark.sql.shuffle.partitions"] == "6" and "spark.master" not in conf


def test_local_master_leaves_the_master_to_the_phase(job, submitted):
    SnapshotBackfillOperator(task_id="snapshot", job=job).execute(context_with())
    conf = submitted[0]["conf"]
    assert "spark.master" not in conf and "spark.executor.instances" not in conf


@pytest.mark.parametrize(("converged", "expected"), [(True, 8), (False, 7)])
def test_catch_up_hands_the_sensor_its_handover_version(job, submitted, converged, expected):
    from airflow_backfill.engine.job_state import update_state

    update_state(job.target, catch_up_handover_version=8, catch_up_converged=converged)
    context = context_with()
    LogStoreCatchUpOperator(task_id="catch_up", job=job).execute(context)
    # watermark 7 (the fake commit); a stalled catch-up hands over at its watermark
    assert context["ti"].pushed["handover_version"] == expected


def test_a_missing_spark_connection_fails_before_spark_submit_naming_it(job, submitted, monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_SPARK_DEFAULT", raising=False)
    with pytest.raises(BackfillConfigError) as error:
        SnapshotBackfillOperator(task_id="snapshot", job=job).execute(context_with())
    message = str(error.value)
    assert "'spark_default' does not exist" in message
    assert "AIRFLOW_CONN_SPARK_DEFAULT='spark://local?deploy-mode=client'" in message
    assert submitted == []


def test_forward_passes_its_stop_grace_below_airflows_kill_escalation(job, submitted):
    ForwardOperator(task_id="forward", job=job, stop_timeout=2.5).execute(context_with())
    args = submitted[0]["args"]
    assert args[args.index("--stop-grace") + 1] == "2.5"
    default = ForwardOperator(task_id="forward2", job=job).stop_timeout
    assert 0 < default < 5.0  # the supervisor's SIGTERM -> SIGKILL escalation delay


def test_forward_on_kill_stops_its_driver_within_the_timeout(job, tmp_path):
    """on_kill finds the driver among the task process's descendants and SIGTERMs it."""
    import subprocess
    import sys

    driver = tmp_path / "forward.py"
    driver.write_text("import signal, sys, time\n"
                      "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
                      "print('running', flush=True)\n"
                      "time.sleep(60)\n")
    process = subprocess.Popen([sys.executable, str(driver)], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline().strip() == "running"
    ForwardOperator(task_id="forward", job=job, stop_timeout=10).on_kill()
    assert process.wait(timeout=1) == 0


@pytest.mark.parametrize("recorded", [None, "delta-spark", "delta-spark,delta-rs"])
def test_asset_events_carry_the_watermark_and_the_feed_readers(job, submitted, recorded):
    from collections import defaultdict
    from types import SimpleNamespace

    from deltalake import DeltaTable

    from airflow_backfill.engine.feed_readers import FEED_READERS_PROPERTY
    from airflow_backfill.task_group import mv_asset

    write_mv_version(job.target, MV_ROWS, job.app_id, watermark=6)
    if recorded is not None:  # as the engine creates an MV; None: an MV from before the property
        DeltaTable(job.target).alter.set_table_properties({FEED_READERS_PROPERTY: recorded}, raise_if_not_exists=False)
    context = context_with()
    context["outlet_events"] = defaultdict(SimpleNamespace)
    asset = mv_asset(job)
    LogStoreCatchUpOperator(task_id="catch_up", job=job, outlets=[asset]).execute(context)
    assert context["outlet_events"][asset].extra == {  # no upstream table: no upstream epochs, the commit stands
        "airflow_backfill.job": "orders_mv", "airflow_backfill.phase": "catch_up",
        "airflow_backfill.watermark": 7, "airflow_backfill.source": job.source,
        "airflow_backfill.feed_readers": None if recorded is None else recorded.split(","),
    }


def test_asset_events_carry_the_mv_version_and_the_upstream_epochs_through_a_chain(job, submitted):
    """An MV over another MV: its event names the base upstream's epoch its version reflects
    (the first MV's version 7, itself at the upstream's epoch 5), what a downstream DAG needs
    to read both MVs at one epoch."""
    from collections import defaultdict
    from types import SimpleNamespace

    from consistency_tables import mv, upstream

    from airflow_backfill.task_group import mv_asset

    base = upstream(str(Path(job.source).parent / "base"), 6)
    mv(job.source, "first_mv", base, [1, 2, 3, 4, 4, 5, 5, 5])  # version 7 reflects epoch 5 of the base
    context = context_with()
    context["outlet_events"] = defaultdict(SimpleNamespace)
    asset = mv_asset(job)
    ForwardOperator(task_id="forward", job=job, outlets=[asset]).execute(context)
    extra = context["outlet_events"][asset].extra
    assert extra["airflow_backfill.watermark"] == 7
    assert extra["airflow_backfill.mv_version"] == 0
    assert extra["airflow_backfill.upstream_epochs"] == {base: 5}


def test_an_event_names_the_mv_version_that_holds_its_watermark_when_another_commit_followed(
        job, submitted, monkeypatch):
    """The shared forward may commit between the phase's end and its event: the event keeps
    the phase's watermark and names the version that committed it, not the newest one."""
    from collections import defaultdict
    from types import SimpleNamespace

    from airflow_backfill.hooks.delta import DeltaBackfillHook
    from airflow_backfill.task_group import mv_asset

    read = DeltaBackfillHook.watermark

    def read_then_forward_commits(hook):
        watermark = read(hook)
        if watermark == 7:  # the phase's commit read back (the JIT choice reads before it)
            write_mv_version(job.target, MV_ROWS, job.app_id, watermark=9)  # the shared forward's round
        return watermark

    monkeypatch.setattr(DeltaBackfillHook, "watermark", read_then_forward_commits)
    commit_upstream_versions(job.source, 10)
    context = context_with()
    context["outlet_events"] = defaultdict(SimpleNamespace)
    asset = mv_asset(job)
    LogStoreCatchUpOperator(task_id="catch_up", job=job, outlets=[asset]).execute(context)
    extra = context["outlet_events"][asset].extra
    assert (extra["airflow_backfill.watermark"], extra["airflow_backfill.mv_version"]) == (7, 0)


def test_verify_submits_its_entry_point_and_pushes_only_its_progress_link(job, submitted):
    from airflow_backfill.operators.phases import VerifyOperator

    context = context_with({"orders_mv": {"parallelism": 2}})
    VerifyOperator(task_id="verify", job=job, key_ranges=16).execute(context)
    call = submitted[0]
    assert os.path.basename(call["application"]) == "verify.py"
    assert call["args"][call["args"].index("--key-ranges") + 1] == "16"
    assert call["args"][call["args"].index("--parallelism") + 1] == "2"
    assert context["ti"].pushed == {"_link_BackfillProgressLink": f"/plugin/airflow-backfill/jobs/{job.name}"}


def test_the_verify_entry_point_checks_its_arguments():
    from airflow_backfill.spark_jobs.verify import parse_args

    args = parse_args(["--job", "job.yaml", "--key-ranges", "8"])
    assert (args.job, args.key_ranges, args.show) == ("job.yaml", 8, 5)
    with pytest.raises(SystemExit):
        parse_args(["--job", "job.yaml", "--key-ranges", "0"])


def test_maintain_submits_its_entry_point_with_its_options(job, submitted):
    from airflow_backfill.operators.phases import MaintainMvOperator
    from airflow_backfill.spark_jobs.maintain import parse_args

    MaintainMvOperator(task_id="maintain", job=job, vacuum=True, max_file_size=64 << 20).execute(context_with())
    call = submitted[0]
    assert os.path.basename(call["application"]) == "maintain.py"
    args = parse_args(["--job", "job.yaml", *call["args"][call["args"].index("--vacuum"):]])
    assert (args.vacuum, args.max_file_size) == (True, 64 << 20)
    with pytest.raises(SystemExit):
        parse_args(["--job", "job.yaml", "--max-file-size", "0"])
    with pytest.raises(BackfillConfigError, match="max_file_size must be between 1 and .*, got 0"):
        MaintainMvOperator(task_id="maintain_again", job=job, max_file_size=0)


@pytest.mark.parametrize(("master", "passed"), [("spark://local?deploy-mode=client", True), ("spark://yarn", False)])
def test_s3_credentials_reach_spark_submit_only_through_its_environment(job, submitted, s3, monkeypatch,
                                                                         master, passed):
    """The connection's secret goes to spark-submit's environment, never to a `--conf` or an
    argument; on YARN (whose env vars the Spark provider turns into `--conf`) not at all."""
    bucket = s3.new_bucket()
    monkeypatch.setenv("AIRFLOW_CONN_LAKE", s3.connection_json())
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_S3", master)
    for variable, value in {**s3.settings().environment(), "AWS_ALLOW_HTTP": "true"}.items():
        monkeypatch.setenv(variable, value)  # for the recorder's own write of the MV
    on_s3 = job.with_overrides(source=f"s3://{bucket}/orders", target=f"s3://{bucket}/orders_mv", aws_conn_id="lake")
    SnapshotBackfillOperator(task_id="snapshot", job=on_s3, conn_id="spark_s3").execute(context_with())
    call = submitted[0]
    assert call["conf"]["spark.hadoop.fs.s3a.endpoint"] == s3.endpoint_url
    assert s3.secret_access_key not in json.dumps([call["conf"], call["args"]])
    assert s3.secret_access_key not in Path(call["args"][call["args"].index("--job") + 1]).read_text()
    assert (call["env"].get("AWS_SECRET_ACCESS_KEY") == s3.secret_access_key) is passed
    assert ("AWS_ACCESS_KEY_ID" in call["env"]) is passed


def test_a_phase_driver_starts_on_the_jvm_archive_when_one_is_built(job, submitted, monkeypatch, tmp_path):
    from airflow_backfill.engine.launch.class_archive import fingerprint

    conf_dir = tmp_path / "spark-conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text("spark.ui.enabled false\n")
    (tmp_path / "jvm" / "conf").mkdir(parents=True)
    (tmp_path / "jvm" / "driver.jsa").write_bytes(b"archive")
    monkeypatch.setenv("AIRFLOW_BACKFILL_JVM_ARCHIVE", str(tmp_path / "jvm" / "driver.jsa"))
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf_dir))
    (tmp_path / "jvm" / "driver.jsa.json").write_text(json.dumps({"fingerprint": fingerprint()}))
    operator = LogStoreCatchUpOperator(task_id="catch_up", job=job, conf={"spark.driver.extraJavaOptions": "-Xss4m"})
    operator.execute(context_with())
    call = submitted[0]
    assert call["env"]["SPARK_CONF_DIR"] == str(tmp_path / "jvm" / "conf")
    assert call["conf"]["spark.driver.extraJavaOptions"] == f"-Xss4m -XX:SharedArchiveFile={tmp_path / 'jvm' / 'driver.jsa'}"
    assert operator.properties_file == str(conf_dir / "spark-defaults.conf")


def test_a_phase_driver_starts_without_an_archive_when_none_is_built(job, submitted, monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW_BACKFILL_JVM_ARCHIVE", str(tmp_path / "missing.jsa"))
    LogStoreCatchUpOperator(task_id="catch_up", job=job).execute(context_with())
    assert "SPARK_CONF_DIR" not in submitted[0]["env"]
    assert "spark.driver.extraJavaOptions" not in submitted[0]["conf"]


@pytest.fixture
def no_archive(monkeypatch):
    """Driver options without the JVM class archive's, whether or not the install built one;
    the upstream judged by the change's share, as a large one would be."""

    monkeypatch.setenv("AIRFLOW_BACKFILL_JVM_ARCHIVE", "off")
    set_sizes(monkeypatch, small_upstream_rows=0)


def small_upstream_change(tables: dict[str, str], job: BackfillJob, new_rows: int) -> None:
    """An upstream of 100,000 rows the MV reflects (watermark 0), then `new_rows` new ones."""
    def rows(first: int, count: int) -> pa.Table:
        return pa.table({"order_id": pa.array(range(first, first + count), pa.int64()),
                         "amount": pa.array([float(i % 613) for i in range(first, first + count)])})

    write_deltalake(tables["source"], rows(0, 100_000), configuration={"delta.enableChangeDataFeed": "true"})
    write_deltalake(tables["source"], rows(100_000, new_rows), mode="append")
    write_mv_version(job.target, MV_ROWS, job.app_id, watermark=0)


@pytest.mark.parametrize(("new_rows", "quick"), [(50, True), (20_000, False)])
def test_a_catch_up_driver_gets_the_quick_jit_only_for_a_small_change(job, tables, submitted, no_archive,
                                                                      new_rows, quick):
    small_upstream_change(tables, job, new_rows)
    LogStoreCatchUpOperator(task_id="catch_up", job=job, conf={"spark.driver.extraJavaOptions": "-Xss4m"}).execute(
        context_with())
    conf = submitted[0]["conf"]
    assert conf["spark.driver.extraJavaOptions"] == "-Xss4m"  # one word per --conf value: the logged command pastes
    assert conf.get("spark.driver.defaultJavaOptions") == ("-XX:TieredStopAtLevel=1" if quick else None)


@pytest.mark.parametrize(("driver_jit", "user_conf", "expected"), [
    ("full", {}, None),
    ("quick", {}, "-XX:TieredStopAtLevel=1"),
    ("auto", {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=4"}, None),
    ("quick", {"spark.driver.defaultJavaOptions": "-XX:-TieredCompilation"}, "-XX:-TieredCompilation"),
])
def test_the_catch_up_jit_can_be_forced_and_the_users_own_choice_wins(
        job, tables, submitted, no_archive, driver_jit, user_conf, expected):
    small_upstream_change(tables, job, 50)
    LogStoreCatchUpOperator(task_id="catch_up", job=job, driver_jit=driver_jit, conf=user_conf).execute(context_with())
    conf = submitted[0]["conf"]
    assert conf.get("spark.driver.defaultJavaOptions") == expected
    assert conf.get("spark.driver.extraJavaOptions") == user_conf.get("spark.driver.extraJavaOptions")


def test_other_phases_keep_the_optimising_jit_and_a_bad_mode_is_refused(job, tables, submitted, no_archive):
    small_upstream_change(tables, job, 50)
    SnapshotBackfillOperator(task_id="snapshot", job=job).execute(context_with())
    assert "spark.driver.defaultJavaOptions" not in submitted[0]["conf"]
    with pytest.raises(BackfillConfigError, match="driver_jit 'fast'"):
        LogStoreCatchUpOperator(task_id="catch_up", job=job, driver_jit="fast")
