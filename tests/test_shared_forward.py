"""The shared forward: one SparkSession keeps a folder's MVs fresh, each committing on its
own. Every MV is checked at every commit against its query recomputed on its upstream as
of the commit's watermark; a failing MV (its target deleted, its job file made invalid)
and a paused one do not hold the others back."""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import pytest
import yaml
from aggregate_upstream import apply_epoch, create, random_ops, values
from deltalake import DeltaTable

from airflow_backfill.engine import control, job_state
from airflow_backfill.engine.phases.catch_up import run_catch_up
from airflow_backfill.engine.phases.snapshot import run_snapshot
from airflow_backfill.job_folder import load_job_folder
from airflow_backfill.shared_forward.folder import folder_members
from airflow_backfill.shared_forward.loop import SharedForward, worker_session
from oracle import assert_every_commit_matches

pytestmark = pytest.mark.spark

QUERIES = {
    "plain_a": ("a", "SELECT id, g, x * 2 AS x2, s FROM source WHERE x > 0 OR h IS NULL", ["id"]),
    "groups_a": ("a", "SELECT g, COUNT(*) AS n, SUM(x) AS sx FROM source GROUP BY g", ["id"]),
    "plain_b": ("b", "SELECT id, h, s FROM source", ["id"]),
    "over_plain_a": ("plain_a", "SELECT g, COUNT(*) AS n, MAX(x2) AS top FROM source GROUP BY g", ["id"]),
    "doomed": ("b", "SELECT id, g FROM source", ["id"]),
    "paused": ("a", "SELECT id, h FROM source", ["id"]),
}


def write_jobs(folder: Path) -> None:
    folder.mkdir()
    for name, (source, query, key) in QUERIES.items():
        (folder / f"{name}.yaml").write_text(yaml.safe_dump({
            "name": name, "source": f"../lake/{source}", "target": f"../lake/{name}", "query": query,
            "primary_key": key, "backfill_parallelism": 1, "parallelism": 1, "lag_threshold": 0,
        }))


def epoch(upstream, rng) -> None:
    apply_epoch(upstream, random_ops(rng, count=3))


def wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout:.0f} s: {what}")


def fresh(job) -> bool:
    return DeltaTable(job.target).transaction_version(job.app_id) == DeltaTable(job.source).version()


def test_one_session_keeps_every_mv_fresh_and_isolates_failures(spark, tmp_path: Path):
    rng = random.Random(62)
    lake = tmp_path / "lake"
    upstreams = {name: create(str(lake / name), [values(rng) for _ in range(20)]) for name in ("a", "b")}
    write_jobs(tmp_path / "jobs")
    jobs = {entry.name: entry.job for entry in load_job_folder(tmp_path / "jobs").jobs}
    assert sorted(jobs) == sorted(QUERIES)
    for name in QUERIES:  # the backfill, as each job's DAG runs it (MVs over MVs after theirs)
        run_snapshot(spark, jobs[name])
        run_catch_up(spark, jobs[name])
    control.write_overrides(jobs["paused"].target, rate_limit=control.PAUSED_RATE_LIMIT)
    paused_at = DeltaTable(jobs["paused"].target).version()

    status_file = tmp_path / "status.json"
    loop = SharedForward(spark, lambda: folder_members(tmp_path / "jobs"), workers=2, poll_interval=0.1,
                         rescan_interval=0.5, max_backoff=1.0, status_path=str(status_file))
    stop = threading.Event()
    result: dict = {}
    runner = threading.Thread(target=lambda: result.update(done=loop.run(stop, max_seconds=600)))
    runner.start()
    try:
        epoch(upstreams["b"], rng)
        wait_until(lambda: fresh(jobs["doomed"]), 120, "the MV to be deleted follows its upstream")
        # One MV's table deleted under the running forward (moved away at once: a round in
        # flight may still write its state file).
        os.rename(jobs["doomed"].target, f"{jobs['doomed'].target}.deleted")
        for _ in range(3):
            for upstream in upstreams.values():
                epoch(upstream, rng)
            time.sleep(0.3)
        live = [jobs[name] for name in ("plain_a", "groups_a", "plain_b", "over_plain_a")]
        wait_until(lambda: all(fresh(job) for job in live), 180, "every live MV at its upstream's latest version")
        wait_until(lambda: loop.members["doomed"].failures >= 2, 60, "the deleted MV failed and was retried")
        # Its job file made invalid: it leaves the set and the error names the file and the field.
        plain_b = tmp_path / "jobs" / "plain_b.yaml"
        plain_b.write_text(plain_b.read_text().replace("\nparallelism: 1\n", "\nparallelism: -3\n"))
        wait_until(lambda: "plain_b" not in loop.members, 30, "the invalid job left the set")
        plain_b_at = DeltaTable(jobs["plain_b"].target).version()
        for upstream in upstreams.values():
            epoch(upstream, rng)
        others = [jobs[name] for name in ("plain_a", "groups_a", "over_plain_a")]
        wait_until(lambda: all(fresh(job) for job in others), 180, "the others stay fresh")
    finally:
        stop.set()
        runner.join(120)
    assert not runner.is_alive()

    for name in ("plain_a", "groups_a", "plain_b", "over_plain_a"):
        job = jobs[name]
        assert assert_every_commit_matches(job.source, job.target, job.query, job.app_id) >= 2, name
    assert DeltaTable(jobs["plain_b"].target).version() == plain_b_at  # not written once it left
    assert DeltaTable(jobs["paused"].target).version() == paused_at
    assert loop.members["paused"].waiting == "paused"
    status = yaml.safe_load(status_file.read_text())
    doomed = status["members"]["doomed"]
    assert doomed["failures"] >= 2 and "no longer exists" in doomed["last_error"], doomed
    (message,) = status["load_errors"].values()
    assert "plain_b.yaml: parallelism must be between 1 and 1024, got -3" in message
    assert result["done"].commits["over_plain_a"] >= 1
    assert job_state.read_state(jobs["plain_a"].target)["forward_shared"] is True


def test_each_worker_has_its_own_views_and_settings(spark):
    """Rounds register temporary views under fixed names (`source`): two MVs' rounds in two
    threads must not read each other's upstream."""
    before = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "3")
    try:
        first, second = worker_session(spark), worker_session(spark)
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", before)
    assert first.conf.get("spark.sql.shuffle.partitions") == "3"
    first.range(2).createOrReplaceTempView("source")
    second.range(5).createOrReplaceTempView("source")
    second.conf.set("spark.sql.shuffle.partitions", "1")
    assert first.sql("SELECT COUNT(*) FROM source").collect()[0][0] == 2
    assert second.sql("SELECT COUNT(*) FROM source").collect()[0][0] == 5
    assert first.conf.get("spark.sql.shuffle.partitions") == "3"
    assert first.sparkContext is spark.sparkContext
