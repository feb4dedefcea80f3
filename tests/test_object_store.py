"""Tables on an S3-compatible server (moto on loopback): the job's small files, the
writer lease, and MV-on-MV checked at every commit against the query recomputed
independently at its watermark. The three phases under a live upstream on S3 run in
tests/e2e/test_object_store_dag.py (the example DAG)."""

from __future__ import annotations

import json
import time

import pyarrow as pa
import pytest
import yaml
from deltalake import DeltaTable
from helpers_delta import write_mv_version
from test_mv_on_mv import check_chain
from trigger_events import first_event

from airflow_backfill.cli import main
from airflow_backfill.engine import control, job_state
from airflow_backfill.engine.delta.log import latest_version
from airflow_backfill.engine.writer_lock import writer_lock
from airflow_backfill.exceptions import TargetError
from airflow_backfill.job import BackfillJob
from airflow_backfill.simulator import commit_epoch, create_orders_table
from airflow_backfill.storage import files
from airflow_backfill.storage.lease import ensure_held
from airflow_backfill.triggers.lag import CaughtUpTrigger

pytestmark = pytest.mark.spark

QUERY = "SELECT order_id, status, amount * quantity AS total FROM source WHERE quantity >= 2"


def make_job(tables: dict[str, str], **overrides) -> BackfillJob:
    fields = dict(name="orders_mv", query=QUERY, primary_key=["order_id"], backfill_parallelism=2,
                  parallelism=1, lag_threshold=0, poll_interval=0.2)
    return BackfillJob(**tables, **{**fields, **overrides})


def test_state_files_and_log_listing_work_on_s3(s3_tables):
    target = s3_tables["target"]
    assert job_state.read_state(target) == {} and control.read_overrides(target) == {}
    job_state.update_state(target, phase="catch_up")
    control.write_overrides(target, rate_limit=500)
    assert job_state.read_state(target)["phase"] == "catch_up"
    assert control.read_overrides(target)["rate_limit"] == 500
    control.reset_overrides(target)
    assert control.read_overrides(target) == {}

    create_orders_table(s3_tables["source"], rows=50, seed=1)
    commit_epoch(s3_tables["source"], __import__("random").Random(1), inserts=5, updates=5, deletes=1)
    assert latest_version(s3_tables["source"]) == DeltaTable(s3_tables["source"]).version() == 1
    assert "00000000000000000001.json" in files.list_names(s3_tables["source"] + "/_delta_log")
    assert files.delete(target) and not files.is_directory(target)


def test_the_writer_lease_admits_one_run_and_a_crashed_holder_expires(s3_tables, monkeypatch):
    target = s3_tables["target"]
    monkeypatch.setenv("AIRFLOW_BACKFILL_LEASE_SECONDS", "3")
    with writer_lock(target, "orders_mv", "catch_up"):
        with pytest.raises(TargetError, match=r"another run of job orders_mv is writing .*catch_up phase"):
            with writer_lock(target, "orders_mv", "forward"):
                pass
        ensure_held(target)
        ensure_held(target + "/_airflow_backfill/aggregate_state")
    # released on exit: the next run takes it at once
    with writer_lock(target, "orders_mv", "forward"):
        pass

    # A holder that stops renewing (a crash) blocks the MV until its lease expires.
    lease = target + "/_airflow_backfill/writer.lease"
    files.write_text(lease, '{"phase": "snapshot", "pid": 1, "host": "gone", "expires_at": %f}' % (time.time() + 2))
    with pytest.raises(TargetError, match="lease valid for"):
        with writer_lock(target, "orders_mv", "catch_up"):
            pass
    time.sleep(2.5)
    with writer_lock(target, "orders_mv", "catch_up"):
        # ...and a holder whose lease was taken over commits nothing more.
        files.write_text(lease, '{"phase": "catch_up", "pid": 2, "host": "other", "expires_at": %f}'
                         % (time.time() + 60))
        with pytest.raises(TargetError, match="no longer holds the writer lease"):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                ensure_held(target)
                time.sleep(0.2)


def test_the_trigger_and_the_cli_read_s3_with_the_jobs_connection_only(s3, s3_tables, monkeypatch, tmp_path,
                                                                        capsys):
    """Where no AWS_* variable is set (a triggerer, a shell), the job's `aws` connection
    is what reaches the tables."""
    create_orders_table(s3_tables["source"], rows=20, seed=1)
    write_mv_version(s3_tables["target"], pa.table({"order_id": pa.array([1], pa.int64())}),
                     "airflow_backfill/orders_mv", 0)
    for variable in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_REGION",
                     "AWS_ALLOW_HTTP"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_LAKE", s3.connection_json())

    trigger = CaughtUpTrigger(source=s3_tables["source"], target=s3_tables["target"],
                              app_id="airflow_backfill/orders_mv", lag_threshold=0, poll_interval=0.05,
                              aws_conn_id="lake")
    assert first_event(trigger) == {"status": "success", "watermark": 0, "upstream_version": 0,
                                    "pending_epochs": 0,
                                    "message": f"MV {s3_tables['target']} caught up: watermark 0, pending epochs 0"}

    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({**make_job(s3_tables).to_mapping(), "aws_conn_id": "lake"}))
    assert main(["status", "--job", str(job), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["upstream_version"] == 0 and status["watermark"] == 0 and status["pending_epochs"] == 0


def test_an_mv_on_an_mv_on_s3(spark, s3_tables, monkeypatch):
    check_chain(spark, s3_tables["source"].rsplit("/", 1)[0], "stateless_then_aggregate", monkeypatch)
