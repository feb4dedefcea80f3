"""Two copies of the same phase at once (two people trigger the same DAG): exactly one
writes, the other is refused with a clear error or finds the work done, and the MV
stays correct."""

from __future__ import annotations

import random
import subprocess

import pytest
from deltalake import DeltaTable
from helpers_delta import mv_commits
from test_crash_recovery import APP_ID, QUERY
from test_spark_submit import snapshot_in_process, spark_submit, write_job

from airflow_backfill.simulator import commit_epoch, create_orders_table
from oracle import assert_every_commit_matches, assert_mv_matches

pytestmark = pytest.mark.e2e

REFUSED = "another run of job orders_e2e is writing the MV"


def start_pair(*args: str) -> list[subprocess.CompletedProcess]:
    processes = [subprocess.Popen(spark_submit(*args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for _ in range(2)]
    return [subprocess.CompletedProcess(p.args, p.wait(timeout=600), p.communicate()[0], "") for p in processes]


def multi_file_upstream(uri: str) -> None:
    create_orders_table(uri, rows=2000, seed=4)
    rng = random.Random(4)
    for _ in range(4):
        commit_epoch(uri, rng, inserts=300, updates=0, deletes=0)


@pytest.fixture(params=["local", "s3"])
def locations(request) -> dict[str, str]:
    """The upstream and MV on local paths, or in a bucket of the loopback S3 server
    (where the writer lock is a lease taken with a conditional write)."""
    return request.getfixturevalue("tables" if request.param == "local" else "s3_tables")


def test_two_snapshots_at_once_make_exactly_one_commit(tmp_path, locations):
    tables = locations
    multi_file_upstream(tables["source"])
    job = write_job(tmp_path, tables)
    runs = start_pair("snapshot", "--job", str(job), "--chunk-bytes", "1")
    outputs = sorted(runs, key=lambda run: run.returncode)
    assert outputs[0].returncode == 0, outputs[0].stdout[-3000:]
    loser = outputs[1]
    refused = loser.returncode == 2 and REFUSED in loser.stdout
    found_done = loser.returncode == 0 and "snapshot skipped" in loser.stdout
    assert refused or found_done, loser.stdout[-3000:]
    history = mv_commits(tables["target"])
    assert len(history) == 1, "more than one snapshot commit"
    assert_mv_matches(tables["source"], tables["target"], QUERY, APP_ID, key=["order_id"])


def test_two_catch_ups_at_once_never_commit_the_same_epochs_twice(spark, tmp_path, tables):
    multi_file_upstream(tables["source"])
    job = write_job(tmp_path, tables)
    snapshot_in_process(spark, job, epoch=1)
    rng = random.Random(5)
    for _ in range(3):
        commit_epoch(tables["source"], rng, inserts=20, updates=40, deletes=10)
    runs = start_pair("catch_up", "--job", str(job))
    for run in runs:
        assert run.returncode == 0 or (run.returncode == 2 and REFUSED in run.stdout), run.stdout[-3000:]
    assert any(run.returncode == 0 for run in runs)
    epochs = [int(commit["airflow_backfill.epoch"]) for commit in mv_commits(tables["target"])]
    assert len(epochs) == len(set(epochs)), f"an epoch range was committed twice: {epochs}"
    assert max(epochs) == DeltaTable(tables["source"]).version()
    assert_every_commit_matches(tables["source"], tables["target"], QUERY, APP_ID, key=["order_id"])
