"""pin_epoch validates everything first and routes a run to the phases the MV still needs."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest
from conftest import commit_upstream_versions, context_with
from deltalake import write_deltalake
from helpers_delta import write_mv_version

from airflow_backfill.engine.snapshot_chunks.progress import SnapshotProgress, save_progress
from airflow_backfill.exceptions import BackfillConfigError, UnsupportedQueryError, UpstreamError
from airflow_backfill.operators.pin_epoch import PinEpochOperator

IDS = {"snapshot_task_id": "g.snapshot", "catch_up_task_id": "g.catch_up", "forward_task_id": "g.forward"}
MV_ROWS = pa.table({"order_id": pa.array([0], pa.int64()), "amount": pa.array([0.0])})


def pin(job) -> PinEpochOperator:
    return PinEpochOperator(task_id="pin_epoch", job=job, **IDS)


def test_no_mv_runs_every_phase_from_the_latest_epoch(job):
    commit_upstream_versions(job.source, 4)
    context = context_with()
    assert pin(job).choose_branch(context) == ["g.snapshot", "g.catch_up", "g.forward"]
    assert context["ti"].pushed == {"upstream_version": 3, "mv_watermark": None, "pinned_epoch": 3}


def test_an_unfinished_snapshot_keeps_its_epoch(job):
    commit_upstream_versions(job.source, 6)
    save_progress(job.target, SnapshotProgress(epoch=2, chunks_total=3, rows_total=3, files_total=3))
    context = context_with()
    pin(job).choose_branch(context)
    assert context["ti"].pushed["pinned_epoch"] == 2


def test_mv_behind_the_threshold_skips_the_snapshot(job):
    commit_upstream_versions(job.source, 6)  # latest 5
    write_mv_version(job.target, MV_ROWS, job.app_id, watermark=2)  # 3 pending > 1
    context = context_with()
    assert pin(job).choose_branch(context) == ["g.catch_up", "g.forward"]
    assert context["ti"].pushed["mv_watermark"] == 2


def test_mv_within_the_threshold_runs_forward_only(job):
    commit_upstream_versions(job.source, 6)
    write_mv_version(job.target, MV_ROWS, job.app_id, watermark=4)  # 1 pending <= 1
    assert pin(job).choose_branch(context_with()) == ["g.forward"]


def test_the_conf_lag_threshold_changes_the_route(job):
    commit_upstream_versions(job.source, 6)
    write_mv_version(job.target, MV_ROWS, job.app_id, watermark=2)
    assert pin(job).choose_branch(context_with({"lag_threshold": 5})) == ["g.forward"]


def test_invalid_conf_fails_before_reading_anything(job):
    with pytest.raises(BackfillConfigError, match=r"unknown key\(s\) in dag_run.conf\['orders_mv'\]: parallelism_backfill"):
        pin(job).choose_branch(context_with({"orders_mv": {"parallelism_backfill": 3}}))
    assert not os.path.exists(job.target)


def test_upstream_without_change_data_feed_is_refused(job):
    write_deltalake(job.source, MV_ROWS)
    with pytest.raises(UpstreamError, match="Change Data Feed"):
        pin(job).choose_branch(context_with())
    assert not os.path.exists(job.target)


def test_missing_upstream_is_refused(job):
    with pytest.raises(UpstreamError, match="is not a Delta table"):
        pin(job).choose_branch(context_with())


def test_unsupported_query_is_refused_when_the_job_loads_before_any_task(job):
    commit_upstream_versions(job.source, 1)
    with pytest.raises(UnsupportedQueryError, match="window"):
        job.with_overrides(query="SELECT order_id, rank() OVER (ORDER BY amount) AS r FROM source")


def test_a_key_spelled_in_another_case_than_the_upstreams_is_refused(job):
    commit_upstream_versions(job.source, 1)
    shouted = job.with_overrides(primary_key=["ORDER_ID"])
    with pytest.raises(UpstreamError, match="spells this column 'order_id'"):
        pin(shouted).choose_branch(context_with())
    assert not os.path.exists(job.target)
