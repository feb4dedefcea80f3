"""A folder backfilled as one: one Spark application snapshots and catches up a folder's
MVs (a stateless one, an aggregate, an MV over an MV and a join of two MVs), an MV over
an MV after its source and the join after both its upstreams, while the upstreams keep
committing. Each MV is checked at every commit against its query recomputed on its
upstreams as of that commit's watermark; killed mid-way (SIGKILL at a catch-up write)
and run again, every MV resumes from what it committed and ends exact."""

from __future__ import annotations

import os
import random
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml
from join_upstreams import create_all, random_epoch
from submit_process import ROOT, spark_submit, submit_env

from airflow_backfill.engine import job_state
from airflow_backfill.engine.delta.log import read_watermark
from airflow_backfill.folder_status import folder_rows
from airflow_backfill.job_folder import load_job_folder
from airflow_backfill.shared_forward import backfill as backfill_module
from airflow_backfill.shared_forward.folder import folder_members
from airflow_backfill.shared_forward.loop import BACKFILLED, SharedForward
from oracle import assert_every_commit_matches, assert_every_join_commit_matches

pytestmark = pytest.mark.spark

OPEN = "SELECT o_id, o_cust, o_status FROM source WHERE o_status IS NOT NULL"
PER_ORDER = "SELECT i_order, COUNT(*) AS lines, SUM(i_qty) AS qty FROM source GROUP BY i_order"
PER_STATUS = "SELECT o_status, COUNT(*) AS n FROM source GROUP BY o_status"
JOINED = ("SELECT o.o_id, o.o_status, p.lines, p.qty FROM orders o "
          "LEFT JOIN per_order p ON p.i_order = o.o_id")
COMMON = {"backfill_parallelism": 1, "parallelism": 1, "lag_threshold": 1, "poll_interval": 0.05}


def write_jobs(folder: Path) -> None:
    """The folder, its files in an order that is not the dependency order."""
    folder.mkdir()
    jobs = {
        "a_joined": {"target": "../lake/joined", "query": JOINED, "sources": {
            "orders": {"table": "../lake/open_orders", "primary_key": ["o_id"]},
            "per_order": {"table": "../lake/per_order", "primary_key": ["i_order"]},
        }},
        "b_per_status": {"source": "../lake/open_orders", "target": "../lake/per_status", "query": PER_STATUS,
                         "primary_key": ["o_id"]},
        "c_open_orders": {"source": "../lake/orders", "target": "../lake/open_orders", "query": OPEN,
                          "primary_key": ["o_id"]},
        "d_per_order": {"source": "../lake/items", "target": "../lake/per_order", "query": PER_ORDER,
                        "primary_key": ["i_order", "i_line"]},
    }
    for name, declaration in jobs.items():
        (folder / f"{name}.yaml").write_text(yaml.safe_dump({"name": name, **declaration, **COMMON}))


class Writer:
    """Commits an epoch to each upstream every `interval` seconds, `epochs` times or until stopped."""

    def __init__(self, tables: dict, seed: int, interval: float = 0.5, epochs: int = 20) -> None:
        self.tables, self.rng, self.interval, self.epochs = tables, random.Random(seed), interval, epochs
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        for _ in range(self.epochs):
            if self.stop.wait(self.interval):
                return
            for table in self.tables.values():
                random_epoch(table, self.rng)

    def __enter__(self) -> Writer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


def assert_exact(folder: Path, lake: Path) -> dict[str, int]:
    """Every MV exact at every commit it made; the number of commits checked per MV."""
    jobs = {entry.name: entry.job for entry in load_job_folder(folder).jobs}
    checked = {}
    for name in ("c_open_orders", "d_per_order", "b_per_status"):
        job = jobs[name]
        key = {"c_open_orders": ["o_id"], "d_per_order": ["i_order"], "b_per_status": ["o_status"]}[name]
        checked[name] = assert_every_commit_matches(job.source, job.target, job.query, job.app_id, key=key)
    joined = jobs["a_joined"]
    vectors = assert_every_join_commit_matches(
        {"orders": str(lake / "open_orders"), "per_order": str(lake / "per_order")},
        joined.target, JOINED, joined.app_id, key=["o_id"])
    checked["a_joined"] = len(vectors)
    return checked


def test_a_folder_is_backfilled_by_one_application_in_dependency_order(spark, tmp_path: Path, monkeypatch):
    lake = tmp_path / "lake"
    tables = create_all(str(lake), seed=85, names=("orders", "items"))
    write_jobs(tmp_path / "jobs")
    spans: dict[str, tuple[float, float]] = {}
    real_backfill = backfill_module.backfill_mv

    def timed(session, job):
        started = time.monotonic()
        done = real_backfill(session, job)
        spans[job.name] = (started, time.monotonic())
        return done

    monkeypatch.setattr(backfill_module, "backfill_mv", timed)
    loop = SharedForward(spark, lambda: folder_members(tmp_path / "jobs", backfill=True), workers=2,
                         backfill_workers=2, poll_interval=0.1, rescan_interval=0.5, max_backoff=1.0)
    with Writer(tables, seed=85):
        result = loop.run(threading.Event(), max_seconds=300, until_backfilled=True)
    assert result.stopped_by == BACKFILLED, result
    assert sorted(spans) == ["a_joined", "b_per_status", "c_open_orders", "d_per_order"]
    assert spans["b_per_status"][0] >= spans["c_open_orders"][1]  # an MV over an MV after its source
    assert spans["a_joined"][0] >= max(spans["c_open_orders"][1], spans["d_per_order"][1])  # a join after both
    for name, status in loop.members.items():
        assert status.backfill is False and status.backfill_seconds is not None and not status.failures, name
        state = job_state.read_state(status.member.target)
        assert state["state"] == job_state.STATE_CREATED and state["backfilled_by"] == "shared_forward", name
    checked = assert_exact(tmp_path / "jobs", lake)
    assert all(count >= 1 for count in checked.values()), checked
    rows, errors = folder_rows(tmp_path / "jobs")  # what `airflow-backfill status --jobs-in` shows
    assert not errors and len(rows) == 4, (rows, errors)
    assert all(row.watermark is not None and "creating" not in row.phase and row.last_error is None
               for row in rows), rows

    # A job file added to the running folder is built without touching the others.
    (tmp_path / "jobs" / "e_items.yaml").write_text(yaml.safe_dump({
        "name": "e_items", "source": "../lake/items", "target": "../lake/items_copy",
        "query": "SELECT i_order, i_line, i_qty FROM source", "primary_key": ["i_order", "i_line"], **COMMON}))
    result = loop.run(threading.Event(), max_seconds=120, until_backfilled=True)
    assert result.stopped_by == BACKFILLED and "e_items" in spans
    copy = load_job_folder(tmp_path / "jobs").job("e_items").job
    assert_every_commit_matches(copy.source, copy.target, copy.query, copy.app_id, key=["i_order", "i_line"])


def test_a_killed_folder_backfill_resumes_and_every_mv_ends_exact(tmp_path: Path):
    lake = tmp_path / "lake"
    tables = create_all(str(lake), seed=86, names=("orders", "items"))
    write_jobs(tmp_path / "jobs")
    command = spark_submit("shared_forward", "--folder", str(tmp_path / "jobs"), "--until-backfilled",
                           "--parallelism", "2", "--workers", "2", "--backfill-workers", "2",
                           "--poll-interval", "0.1", "--rescan-interval", "1", "--max-seconds", "400")
    env = submit_env({**os.environ, "PYTHONPATH": str(ROOT)})
    with Writer(tables, seed=86, interval=0.3, epochs=40):
        killed = subprocess.run(command, env={**env, "AIRFLOW_BACKFILL_FAULT": "catch_up:after_write"},
                                capture_output=True, text=True, timeout=600)
        assert killed.returncode in (-9, 137), (killed.returncode, killed.stdout[-3000:], killed.stderr[-3000:])
        jobs = {entry.name: entry.job for entry in load_job_folder(tmp_path / "jobs").jobs}
        assert any(read_watermark(job.target, job.app_id) is not None for job in jobs.values()), \
            "nothing was committed before the kill"
        assert not all(job_state.read_state(job.target).get("state") == job_state.STATE_CREATED
                       for job in jobs.values()), "the kill came after the whole backfill"
        rerun = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, (rerun.returncode, rerun.stdout[-3000:], rerun.stderr[-3000:])
    built = re.findall(r"folder backfill: (\d+) of (\d+) MVs built", rerun.stdout + rerun.stderr)
    assert built and built[-1][0] == built[-1][1], built  # the rerun built what the kill left
    for job in jobs.values():
        assert job_state.read_state(job.target)["state"] == job_state.STATE_CREATED, job.name
    checked = assert_exact(tmp_path / "jobs", lake)
    assert all(count >= 1 for count in checked.values()), checked
