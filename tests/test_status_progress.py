"""The numbers `status --json` and the UI page share: exact snapshot fractions in rows and
input bytes, a rate and ETA from the durable chunk records, lag in epochs and seconds,
the parallelism of every MV commit and the live-control settings."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from deltalake import CommitProperties, Transaction, write_deltalake

from airflow_backfill.cli import main
from airflow_backfill.engine.control import write_overrides
from airflow_backfill.engine.job_state import state_dir
from airflow_backfill.engine.snapshot_chunks.progress import (
    PROGRESS_FILE,
    DoneChunk,
    SnapshotProgress,
    load_progress,
    save_progress,
)
from airflow_backfill.engine.status import job_status, snapshot_rates
from airflow_backfill.job import BackfillJob, load_job
from airflow_backfill.simulator import create_orders_table, run_simulator


@pytest.fixture
def job_file(tmp_path: Path, tables: dict[str, str]) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({
        "name": "orders_mv", "query": "SELECT order_id, amount FROM source", "primary_key": ["order_id"],
        "backfill_parallelism": 3, "parallelism": 1, "rate_limit": 500, **tables,
    }))
    return path


def chunk(index: int, *, rows: int, size: int | None, seconds: float, finished_at: float | None,
          run_id: str = "run-b", parallelism: int = 2) -> DoneChunk:
    return DoneChunk(index, rows, rows, seconds, parallelism, run_id,
                     bytes_in=size, finished_at=finished_at)


def commit_mv(job: BackfillJob, *, watermark: int, phase: str, parallelism: int) -> None:
    """An MV commit carrying the metadata a phase records."""
    metadata = {"phase": phase, "epoch": str(watermark), "parallelism": str(parallelism), "rows": "1"}
    write_deltalake(job.target, pa.table({"order_id": [1]}), mode="overwrite", commit_properties=CommitProperties(
        app_transactions=[Transaction(job.app_id, watermark)],
        custom_metadata={f"airflow_backfill.{key}": value for key, value in metadata.items()},
    ))


def status_json(job_file: Path, capsys) -> dict:
    assert main(["status", "--job", str(job_file), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_snapshot_fractions_rate_and_eta_come_from_the_chunk_records(job_file, tables, capsys):
    create_orders_table(tables["source"], rows=10, seed=1)
    progress = SnapshotProgress(epoch=0, chunks_total=4, rows_total=1000, files_total=4, bytes_total=4000)
    # An earlier run's chunk: counted as done, left out of the rate (time between runs is not speed).
    progress.done[0] = chunk(0, rows=100, size=400, seconds=50.0, finished_at=1000.0, run_id="run-a")
    progress.done[1] = chunk(1, rows=300, size=1200, seconds=2.0, finished_at=5002.0)
    progress.done[2] = chunk(2, rows=200, size=800, seconds=2.0, finished_at=5006.0, parallelism=1)
    save_progress(tables["target"], progress)

    snapshot = status_json(job_file, capsys)["snapshot"]
    # run-b: from 5000 (first chunk's start) to 5006, 500 rows and 2000 bytes.
    assert (snapshot["rows_done"], snapshot["rows_total"]) == (600, 1000)
    assert (snapshot["bytes_done"], snapshot["bytes_total"]) == (2400, 4000)
    assert snapshot["rows_per_second"] == pytest.approx(500 / 6, abs=0.1)
    assert snapshot["bytes_per_second"] == pytest.approx(2000 / 6, abs=0.1)
    assert snapshot["eta_seconds"] == pytest.approx(400 / (500 / 6), abs=0.1)
    assert snapshot["chunk_parallelism"] == [2, 2, 1]


def test_progress_recorded_before_sizes_and_times_were_kept_still_loads(tables):
    progress = SnapshotProgress(epoch=3, chunks_total=2, rows_total=20, files_total=2)
    progress.done[0] = chunk(0, rows=10, size=None, seconds=1.0, finished_at=None)
    save_progress(tables["target"], progress)
    path = os.path.join(state_dir(tables["target"]), PROGRESS_FILE)
    with open(path) as handle:
        data = json.load(handle)
    del data["bytes_total"]
    for record in data["done"].values():
        del record["bytes_in"], record["finished_at"]
    with open(path, "w") as handle:
        json.dump(data, handle)

    loaded = load_progress(tables["target"])
    assert loaded is not None and loaded.bytes_total is None and loaded.bytes_done is None
    assert loaded.done[0].finished_at is None  # unknown, never "now"
    assert snapshot_rates(loaded) == (None, None)


def test_lag_commits_and_control_of_a_running_catch_up(job_file, tables, capsys):
    create_orders_table(tables["source"], rows=20, seed=1)
    job = load_job(job_file)
    commit_mv(job, watermark=0, phase="snapshot", parallelism=3)
    commit_mv(job, watermark=0, phase="catch_up", parallelism=2)
    run_simulator(tables["source"], rows=20, epoch_interval=0.6, inserts=2, updates=2, deletes=1,
                  max_epochs=2, seed=1)
    write_overrides(job.target, rate_limit=0, backfill_parallelism=5)

    status = status_json(job_file, capsys)
    assert status["pending_epochs"] == status["upstream_version"] - status["watermark"] == 2
    assert status["lag_seconds"] is not None and status["lag_seconds"] >= 1.0
    assert [(c["phase"], c["parallelism"]) for c in status["commits"]] == [("catch_up", 2), ("snapshot", 3)]
    assert status["control"] == {
        "backfill_parallelism": 5, "rate_limit": 0, "job_backfill_parallelism": 3, "job_rate_limit": 500,
        "altered": True, "paused": True, "paused_since": None,
    }
    assert main(["status", "--job", str(job_file)]) == 0
    text = capsys.readouterr().out
    assert "paused          rate limit 0" in text and "lag seconds" in text


def test_status_json_is_job_status_to_dict(job_file, tables, capsys):
    """The page and the CLI print one structure: the CLI adds nothing and drops nothing."""
    create_orders_table(tables["source"], rows=5, seed=1)
    expected = json.loads(json.dumps(job_status(load_job(job_file)).to_dict(), default=str))
    assert status_json(job_file, capsys) == expected
