"""A join's snapshot as a spark-submit process, pinned by `--epochs` and SIGKILLed after
its first chunk while two upstreams keep committing; the rerun (in the test's Spark)
resumes the chunks at the pinned versions and catch-up brings every upstream up."""

from __future__ import annotations

import json
import os
import random
import subprocess
import threading
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from deltalake import write_deltalake
from join_upstreams import create_all, random_epoch, random_row, sources
from submit_process import spark_submit, submit_env

from airflow_backfill.engine.phases.catch_up import run_catch_up
from airflow_backfill.engine.phases.snapshot import run_snapshot
from airflow_backfill.job import load_job
from oracle import assert_every_join_commit_matches

pytestmark = pytest.mark.e2e

QUERY = ("SELECT i.i_order, i.i_line, i.i_qty, o.o_status FROM items i JOIN orders o ON i.i_order = o.o_id "
         "WHERE i.i_qty > 1")


def test_a_killed_join_snapshot_resumes_at_its_pinned_versions(spark, tmp_path: Path):
    tables = create_all(str(tmp_path), seed=31, names=("orders", "items"))
    rng = random.Random(31)
    items = tables["items"]
    extra = [random_row("items", rng, (100 + n, 0)) for n in range(3)]
    write_deltalake(items.uri, pa.Table.from_pylist(extra, schema=items.schema), mode="append")
    items.rows.update({(row["i_order"], row["i_line"]): row for row in extra})
    pinned = {"orders": 0, "items": 1}
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump({
        "name": "joined_e2e", "target": str(tmp_path / "mv"), "query": QUERY, "sources": sources(tables),
        "backfill_parallelism": 2, "lag_threshold": 0, "round_plan": "incremental",
    }))
    stop = threading.Event()

    def write(name: str, seed: int) -> None:
        writer_rng = random.Random(seed)
        while not stop.wait(1.0):
            random_epoch(tables[name], writer_rng)

    writers = [threading.Thread(target=write, args=(name, seed), daemon=True) for name, seed in
               (("orders", 1), ("items", 2))]
    for writer in writers:
        writer.start()
    try:
        env = {**os.environ, "AIRFLOW_BACKFILL_FAULT": "snapshot:after_chunks=1"}
        done = subprocess.run(
            spark_submit("snapshot", "--job", str(job_file), "--epochs", json.dumps(pinned), "--chunk-bytes", "1"),
            capture_output=True, text=True, timeout=600, env=submit_env(env),
        )
        assert done.returncode != 0 and "fault injection: killing" in done.stdout + done.stderr, done.stderr[-3000:]
        job = load_job(job_file)
        latest = {name: table.version() for name, table in tables.items()}
        resumed = run_snapshot(spark, job, epochs=latest, chunk_bytes=1)  # the unfinished snapshot's versions win
        assert resumed.chunks_run == 1 and resumed.epoch == sum(pinned.values())
    finally:
        stop.set()
        for writer in writers:
            writer.join(timeout=30)
    run_catch_up(spark, job)
    vectors = assert_every_join_commit_matches({n: t.uri for n, t in tables.items()}, job.target, QUERY, job.app_id,
                                               key=["i_order", "i_line"])
    assert vectors[0] == pinned and vectors[-1] == {name: table.version() for name, table in tables.items()}
