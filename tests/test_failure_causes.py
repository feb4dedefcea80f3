"""Each failure is reported as what it is: a version never committed or whose log expired,
a store that nothing answers on, credentials the store refuses, a local path this process
may not read, brokers that are down or refuse the SASL login, a connection a secrets
backend refuses, Delta missing from the Spark driver (and nothing else called that), an
unfinished snapshot kept when its upstream cannot be read, and a writer lease taken over
between a round's write and its commit (nothing committed).
Every failure is provoked for real: a wrong port, moto's key check switched on, a folder
without permissions, a wrong password on the test broker's SASL listener."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from kafka_fixtures import SASL_USER

from airflow_backfill.engine.delta.log import check_upstream, delta_table, open_upstream
from airflow_backfill.exceptions import (
    AccessDeniedError,
    BackfillConfigError,
    TargetError,
    UnreachableError,
    UpstreamError,
)
from airflow_backfill.loopback import free_port
from airflow_backfill.storage import files
from airflow_backfill.storage.s3_settings import S3Settings, register_settings

APP_ID = "airflow_backfill/orders_mv"


def versions(uri: str, count: int, **options) -> None:
    for value in range(count):
        write_deltalake(uri, pa.table({"k": [value]}), mode="append" if value else "error", **options)


def test_a_version_never_committed_says_so(tmp_path):
    uri = str(tmp_path / "t")
    versions(uri, 3)
    with pytest.raises(UpstreamError, match=r"has no version 7: its latest is 2\. That epoch was never committed") as raised:
        open_upstream(uri, 7)
    assert "vacuumed" not in str(raised.value) and "expired" not in str(raised.value)
    assert "delta-rs:" in str(raised.value)  # the underlying error is quoted


def test_a_version_whose_log_expired_says_which_versions_remain(tmp_path):
    uri = str(tmp_path / "t")
    versions(uri, 4)
    DeltaTable(uri).create_checkpoint()  # what log cleanup keeps: a checkpoint at 3 ...
    for version in range(3):  # ... and no commit files before it
        os.remove(os.path.join(uri, "_delta_log", f"{version:020d}.json"))
    for version in (0, 1, 2):
        with pytest.raises(UpstreamError, match=rf"can no longer be read as of version {version}: its log keeps "
                                                r"versions 3\.\.3, older entries expired \(delta\.logRetentionDuration\)"):
            check_upstream(uri, version)
    assert open_upstream(uri, 3).version() == 3


def test_a_local_table_this_process_may_not_read_says_so(tmp_path):
    """The check runs in a child process without the right to read the table's folder."""
    uri = str(tmp_path / "t")
    versions(uri, 1)
    check = ("import sys\nfrom airflow_backfill.engine.delta.log import check_upstream\n"
             "try:\n    check_upstream(sys.argv[1])\nexcept Exception as error:\n"
             "    print(type(error).__name__, error)\n")
    os.chmod(uri, 0)
    try:
        said = subprocess.run(without_read_rights([sys.executable, "-c", check, uri]), capture_output=True, text=True,
                              timeout=120)
    finally:
        os.chmod(uri, 0o755)
    assert said.stdout.startswith("AccessDeniedError this process (user "), said.stdout + said.stderr[-2000:]
    assert f"may not read {uri}: the operating system denied it" in said.stdout
    assert "Permission denied" in said.stdout  # the original error, quoted
    assert open_upstream(uri).version() == 0  # readable again: the folder's permissions were the cause


@pytest.fixture
def s3_table(s3, tmp_path):
    """A table of three versions on the session's S3 server, in a bucket of its own."""
    uri = f"s3://{s3.new_bucket()}/lake/t"
    versions(uri, 3, storage_options=s3.settings().delta_rs_options())
    return uri


def test_a_store_nothing_answers_on_is_named_as_such(s3, s3_table):
    port = free_port()  # nothing listens there
    register_settings(s3_table, S3Settings(endpoint_url=f"http://127.0.0.1:{port}", region="us-east-1",
                                           access_key_id=s3.access_key_id, secret_access_key=s3.secret_access_key))
    for read in (lambda: check_upstream(s3_table, 1), lambda: delta_table(s3_table, 1)):  # pyarrow's S3, delta-rs
        with pytest.raises(UnreachableError, match=rf"cannot reach http://127\.0\.0\.1:{port} to read {s3_table}: the "
                                                   r"connection (was refused \(nothing listens at that address and port\)|could not be made)\. Check the endpoint of "
                                                   "the job's aws_conn_id connection") as raised:
            read()
        assert "vacuumed" not in str(raised.value) and raised.value.__cause__ is not None
        assert s3.secret_access_key not in str(raised.value) + str(raised.value.__cause__)
    # the engine's own files beside the table (state, progress, heartbeats), read and written
    state = f"{s3_table}/_airflow_backfill/state.json"
    for action, use in (("read", lambda: files.read_text(state)), ("list", lambda: files.list_names(s3_table)),
                        ("write", lambda: files.write_text(state, "{}"))):
        with pytest.raises(UnreachableError, match=rf"cannot reach http://127\.0\.0\.1:{port} to {action} {s3_table}"):
            use()


@pytest.fixture
def s3_checking_keys(s3):
    """The session's S3 server checking every request's key for the test's duration (moto
    takes any key otherwise); it knows none, so every request is refused."""
    def check_keys(after: str) -> None:
        request = urllib.request.Request(f"{s3.endpoint_url}/moto-api/reset-auth", data=after.encode(), method="POST",
                                         headers={"Content-Type": "text/plain"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert json.loads(answer.read())["status"] == "ok"

    check_keys("0")
    try:
        yield s3
    finally:
        check_keys("inf")


def test_credentials_the_store_refuses_are_named_as_such(s3_table, s3_checking_keys):
    s3 = s3_checking_keys
    register_settings(s3_table, s3.settings())
    with pytest.raises(AccessDeniedError, match=rf"{s3.endpoint_url} refused the credentials to read {s3_table}: it "
                                                "does not know the access key id. Fix the access key id, secret access "
                                                "key or session token of the job's aws_conn_id connection") as raised:
        delta_table(s3_table, 1)
    assert "InvalidAccessKeyId" in str(raised.value)  # the store's own words, quoted
    # pyarrow's HEAD request gets a 403 without a body: refused, without saying why
    with pytest.raises(AccessDeniedError, match=rf"refused to let this process read {s3_table} \(403 "
                                                "Forbidden\\): the credentials of the job's aws_conn_id connection are "
                                                "wrong or expired, or their policy does not allow it") as raised:
        check_upstream(s3_table, 1)
    assert "vacuumed" not in str(raised.value)
    assert s3.secret_access_key not in str(raised.value) + str(raised.value.__cause__)
    with pytest.raises(AccessDeniedError, match=f"to write {s3_table}/_airflow_backfill/state.json") as raised:
        files.write_text(f"{s3_table}/_airflow_backfill/state.json", "{}")
    assert isinstance(raised.value, OSError)  # a best-effort write (a heartbeat) still catches it


def test_kafka_brokers_nothing_answers_on_are_named_as_such():
    from airflow_backfill.kafka.connection import KafkaSettings
    from airflow_backfill.kafka.offsets import topic_ranges

    server = f"127.0.0.1:{free_port()}"
    with pytest.raises(UnreachableError, match=rf"cannot reach any Kafka broker of the job's bootstrap_servers: "
                                               rf"{server}: the connection was refused \(nothing listens on that port\)"):
        topic_ranges(KafkaSettings(server), "orders", timeout=3)


def test_a_sasl_login_the_brokers_refuse_is_named_as_such(kafka_broker, kafka_simulator):
    from airflow_backfill.kafka.connection import KafkaSettings
    from airflow_backfill.kafka.offsets import topic_ranges

    kafka_simulator.create_topic(1)

    def login(password: str) -> KafkaSettings:
        return KafkaSettings(kafka_broker.sasl_bootstrap_servers, {
            "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": SASL_USER,
            "sasl.password": password}, conn_id="kafka_sasl")

    assert list(topic_ranges(login(kafka_broker.sasl_users[SASL_USER]), kafka_simulator.topic, timeout=10)) == [0]
    wrong = "not-" + kafka_broker.sasl_users[SASL_USER]
    with pytest.raises(AccessDeniedError, match=r"take connections but closed every one during the client's handshake "
                                                r"for 3 s: they refused the SASL login \(check sasl.username, "
                                                r"sasl.password and sasl.mechanism PLAIN of connection 'kafka_sasl'\)") as raised:
        topic_ranges(login(wrong), kafka_simulator.topic, timeout=3)
    assert wrong not in str(raised.value)


class DenyingSecretsBackend:
    """A secrets backend whose policy denies every connection (as Vault's can)."""

    def _set_connection_class(self, connection_class) -> None:
        pass

    def get_connection(self, conn_id: str):
        from airflow.sdk.exceptions import AirflowSecretsBackendAccessDenied

        raise AirflowSecretsBackendAccessDenied(f"policy 'workers' may not read connection {conn_id}")

    def get_variable(self, key: str):
        return None

    def get_config(self, key: str):
        return None


def test_a_connection_the_secrets_backend_refuses_is_not_called_missing(monkeypatch):
    from airflow.sdk import configuration

    from airflow_backfill.kafka.connection import settings_from_connection as kafka_connection
    from airflow_backfill.storage.s3_settings import settings_from_connection as aws_connection

    with pytest.raises(BackfillConfigError, match="aws_conn_id 'no_such' is not an Airflow connection; create it"):
        aws_connection("no_such")
    monkeypatch.setattr(configuration, "_secrets_backend_cache", {})
    monkeypatch.setenv("AIRFLOW__SECRETS__BACKEND", f"{__name__}.DenyingSecretsBackend")
    with pytest.raises(AccessDeniedError, match=r"the secrets backend refused this process the job's aws_conn_id "
                                                r"connection 'lake' \(policy 'workers' may not read connection lake\)"):
        aws_connection("lake")
    with pytest.raises(AccessDeniedError, match="refused this process the job's kafka_conn_id connection 'brokers'"):
        kafka_connection("brokers")


@pytest.mark.spark
def test_only_a_missing_delta_class_is_called_a_missing_delta(spark, monkeypatch):
    from py4j.java_gateway import GatewayParameters, JavaGateway
    from py4j.protocol import Py4JNetworkError

    from airflow_backfill.engine import spark_session

    spark_session._require_delta(spark)  # the session's driver has Delta
    monkeypatch.setattr(spark_session, "DELTA_CLASS", "io.delta.tables.NoSuchClass")
    with pytest.raises(BackfillConfigError, match=r"not on this Spark driver's classpath.*\(The JVM: "
                                                  r"java.lang.ClassNotFoundException: io.delta.tables.NoSuchClass\)"):
        spark_session._require_delta(spark)

    class Unreachable:  # a driver whose JVM is gone: nothing listens on its gateway's port
        _jvm = JavaGateway(gateway_parameters=GatewayParameters(port=free_port())).jvm

    with pytest.raises(Py4JNetworkError):
        spark_session._require_delta(Unreachable())  # type: ignore[arg-type]


@pytest.mark.spark
def test_a_lease_taken_over_between_write_and_commit_commits_nothing(spark, s3_tables):
    from airflow_backfill.engine.delta.commits import append, merge_changes
    from airflow_backfill.engine.writer_lock import writer_lock

    target = s3_tables["target"]
    lease = target + "/_airflow_backfill/writer.lease"
    rows = spark.createDataFrame([(1, "a"), (2, "b")], "id long, v string")
    append(rows, target, app_id=APP_ID, version=0, user_metadata="{}", create=True)
    committed = DeltaTable(target).version()

    def take_over() -> None:  # another run, whose clock says the lease expired
        files.write_text(lease, json.dumps({"phase": "catch_up", "pid": 2, "host": "other",
                                            "expires_at": time.time() + 60}))

    with writer_lock(target, "orders_mv", "catch_up"):
        with pytest.raises(TargetError, match="no longer holds the writer lease of .*: another run took it over. It "
                                              "stops without committing"):
            append(spark.createDataFrame([(3, "c")], "id long, v string"), target, app_id=APP_ID, version=1,
                   user_metadata="{}", before_commit=take_over)
    assert DeltaTable(target).version() == committed and DeltaTable(target).transaction_version(APP_ID) == 0
    files.remove(lease)  # the other run ended

    # MERGE writes and commits in one call of Delta's: the lease is asked of the store right
    # before it, which sees a takeover that this run's own renewals have not noticed yet.
    changes = spark.createDataFrame([(1, "z", True)], "id long, v string, __present boolean")
    with writer_lock(target, "orders_mv", "catch_up"):
        take_over()
        with pytest.raises(TargetError, match="another run took it over"):
            merge_changes(spark, target, changes, ["id"], None, app_id=APP_ID, version=1, user_metadata="{}",
                          null_safe=False)
    assert DeltaTable(target).version() == committed
    assert DeltaTable(target).transaction_version(APP_ID) == 0


@pytest.mark.spark
def test_maintenance_stops_before_its_commands_once_the_lease_is_taken_over(spark, s3_tables, monkeypatch):
    """OPTIMIZE, REORG and VACUUM write and commit in one call of Delta's: the lease is asked
    of the store right before each, as for a round's MERGE."""
    from airflow_backfill.engine import maintenance
    from airflow_backfill.engine.phases.snapshot import run_snapshot
    from airflow_backfill.job import BackfillJob
    from airflow_backfill.simulator import create_orders_table

    create_orders_table(s3_tables["source"], rows=50, seed=31)
    job = BackfillJob(name="orders_mv", query="SELECT order_id, amount FROM source", primary_key=["order_id"],
                      **s3_tables)
    run_snapshot(spark, job, chunk_bytes=1)  # several files: OPTIMIZE would have work to commit
    committed = DeltaTable(job.target).version()
    counted = maintenance._file_count

    def counted_then_taken_over(session, uri: str) -> int:  # another run takes the lease meanwhile
        files.write_text(job.target + "/_airflow_backfill/writer.lease", json.dumps(
            {"phase": "catch_up", "pid": 2, "host": "other", "expires_at": time.time() + 60}))
        return counted(session, uri)

    monkeypatch.setattr(maintenance, "_file_count", counted_then_taken_over)
    with pytest.raises(TargetError, match="no longer holds the writer lease of .*: another run took it over"):
        maintenance.maintain_mv(spark, job)
    assert DeltaTable(job.target).version() == committed


def without_read_rights(command: list[str]) -> list[str]:
    """`command` run so that folders without permissions stay closed to it (root reads
    every folder unless it gives up the capabilities that let it)."""
    if os.geteuid() != 0:
        return command
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is needed to drop root's right to read every folder"
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search", *command]


@pytest.mark.spark
def test_an_unreadable_upstream_keeps_an_unfinished_snapshot_for_a_rerun(spark, tables, monkeypatch):
    """A resume that cannot read the upstream is not a resume that found its epoch gone:
    the committed chunks stay, for a rerun once the upstream can be read."""
    from test_snapshot_resume import Killed, crash_at, job_for, upstream_with_files

    from airflow_backfill.engine.phases.snapshot import run_snapshot
    from airflow_backfill.engine.snapshot_chunks.progress import load_progress

    upstream_with_files(tables["source"], files=3)
    job = job_for(tables)
    crash_at(monkeypatch, "after_chunks=1")
    with pytest.raises(Killed):
        run_snapshot(spark, job, chunk_bytes=1)
    monkeypatch.undo()
    done = sorted(load_progress(tables["target"]).done)
    assert done == [0]

    pin = ("import json, sys\nfrom airflow_backfill.engine.phases.snapshot import OneUpstream\n"
           "from airflow_backfill.engine.snapshot_chunks.skeleton import pin_or_resume\n"
           "from airflow_backfill.job import BackfillJob\n"
           "job = BackfillJob.from_mapping(json.loads(sys.argv[1]))\n"
           "try:\n    pin_or_resume(job, OneUpstream(None, job, None))\n"
           "except Exception as error:\n    print(type(error).__name__, error)\n")
    os.chmod(tables["source"], 0)
    try:
        said = subprocess.run(without_read_rights([sys.executable, "-c", pin, json.dumps(job.to_mapping())]),
                              capture_output=True, text=True, timeout=120)
    finally:
        os.chmod(tables["source"], 0o755)
    assert said.stdout.startswith("AccessDeniedError this process"), said.stdout + said.stderr[-2000:]
    assert sorted(load_progress(tables["target"]).done) == done
    assert run_snapshot(spark, job, chunk_bytes=1).chunks_run == 2  # the rerun resumes

