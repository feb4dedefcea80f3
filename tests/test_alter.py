"""`airflow-backfill alter`: overrides of the backfill parallelism and rate limit, the
message saying when they apply, usage errors, and the snapshot picking a change up at
its next chunk."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
import yaml
from deltalake import DeltaTable, write_deltalake
from helpers_delta import mv_commits, write_mv_version

from airflow_backfill.cli import main
from airflow_backfill.engine import job_state
from airflow_backfill.engine.control import control_path, effective_settings, read_overrides
from airflow_backfill.engine.phases.snapshot import run_snapshot
from airflow_backfill.engine.snapshot_chunks import run as snapshot_module
from airflow_backfill.engine.snapshot_chunks.progress import (
    DoneChunk,
    SnapshotProgress,
    load_progress,
    save_progress,
)
from airflow_backfill.exceptions import BackfillConfigError
from airflow_backfill.job import load_job
from airflow_backfill.simulator import create_orders_table, run_simulator

JOB_DEFAULTS = {"backfill_parallelism": 2, "parallelism": 1, "rate_limit": 500}


@pytest.fixture
def job_file(tmp_path: Path, tables: dict[str, str]) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({
        "name": "orders_mv", "query": "SELECT order_id, amount FROM source", "primary_key": ["order_id"],
        **tables, **JOB_DEFAULTS,
    }))
    return path


def alter(job_file: Path, *options: str) -> int:
    return main(["alter", "--job", str(job_file), *options])


def output_lines(capsys) -> list[str]:
    return capsys.readouterr().out.strip().splitlines()


# ---- usage errors -----------------------------------------------------------------------


@pytest.mark.parametrize(("options", "message"), [
    (["--backfill-parallelism", "0"], "argument --backfill-parallelism: expected a whole number from 1 to 1024, got 0"),
    (["--backfill-parallelism", "-3"], "argument --backfill-parallelism: expected a whole number from 1 to 1024, got -3"),
    (["--backfill-parallelism", "1025"], "argument --backfill-parallelism: expected a whole number from 1 to 1024"),
    (["--backfill-parallelism", "two"], "argument --backfill-parallelism: expected a whole number, got 'two'"),
    (["--backfill-parallelism", "1.5"], "argument --backfill-parallelism: expected a whole number, got '1.5'"),
    (["--rate-limit", "-10"], "argument --rate-limit: expected 1 row per second or more"),
    (["--rate-limit", "fast"], "argument --rate-limit: expected a whole number, got 'fast'"),
    (["--rate-limit", str(10**13)], "rate_limit must be between 1 and"),
    ([], "nothing to alter: give --backfill-parallelism N, --rate-limit ROWS_PER_S, --max-round-epochs N, "
          "--max-round-bytes BYTES, --resume or --reset"),
    (["--resume", "--rate-limit", "5"], "--resume lifts a pause and cannot be combined with --rate-limit"),
    (["--resume", "--reset"], "give --reset or --resume, not both"),
    (["--reset", "--backfill-parallelism", "4"], "--reset restores the job's own values and cannot be combined "
                                                  "with --backfill-parallelism"),
    (["--reset", "--rate-limit", "none"], "cannot be combined with --rate-limit"),
])
def test_invalid_arguments_exit_2_with_a_clear_message(job_file, tables, options, message, capsys):
    assert alter(job_file, *options) == 2
    err = capsys.readouterr().err
    assert "airflow-backfill alter: error: " in err and message in err
    assert "Traceback" not in err
    assert not os.path.exists(control_path(tables["target"])), "a refused alter wrote overrides"


def test_a_job_file_that_does_not_load_is_refused(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\n")
    assert alter(bad, "--rate-limit", "10") == 2
    assert "missing required field(s)" in capsys.readouterr().err


# ---- where the job is, and when the change applies --------------------------------------


def test_alter_before_the_backfill_starts_is_stored_for_its_start(job_file, tables, capsys):
    assert alter(job_file, "--backfill-parallelism", "6", "--rate-limit", "250") == 0
    summary, when = output_lines(capsys)
    assert "backfill_parallelism=2, rate_limit=500 rows/s -> backfill_parallelism=6, rate_limit=250 rows/s" in summary
    assert when.startswith("applies when the backfill of job orders_mv starts")
    assert f"the MV {tables['target']} does not exist yet" in when
    assert not os.path.isdir(os.path.join(tables["target"], "_delta_log")), "alter must not create the MV"
    settings = effective_settings(load_job(job_file))
    assert (settings.backfill_parallelism, settings.rate_limit, settings.altered) == (6, 250, True)


def test_alters_merge_and_reset_restores_the_job_values(job_file, tables, capsys):
    assert alter(job_file, "--backfill-parallelism", "5") == 0
    assert alter(job_file, "--rate-limit", "none") == 0
    assert read_overrides(tables["target"]) == {"backfill_parallelism": 5, "rate_limit": None}
    job = load_job(job_file)
    assert (effective_settings(job).backfill_parallelism, effective_settings(job).rate_limit) == (5, None)
    capsys.readouterr()

    assert alter(job_file, "--reset") == 0
    summary = output_lines(capsys)[0]
    assert "reset to the job's values" in summary
    assert summary.endswith(f"-> backfill_parallelism={JOB_DEFAULTS['backfill_parallelism']}, "
                            f"rate_limit={JOB_DEFAULTS['rate_limit']} rows/s")
    assert not os.path.exists(control_path(tables["target"]))
    settings = effective_settings(job)
    assert (settings.backfill_parallelism, settings.rate_limit, settings.altered) == (2, 500, False)


@pytest.mark.parametrize("done", [0, 2, 9])
def test_alter_during_the_snapshot_applies_at_its_next_chunk(job_file, tables, capsys, done):
    total = 10
    progress = SnapshotProgress(epoch=3, chunks_total=total, rows_total=1000, files_total=total)
    for index in range(done):
        progress.done[index] = DoneChunk(index, f"data/c{index}", 100, 100, 0.1, 2, "run")
    save_progress(tables["target"], progress)
    job_state.update_state(tables["target"], phase="snapshot", state="creating")

    assert alter(job_file, "--backfill-parallelism", "3") == 0
    when = output_lines(capsys)[1]
    assert when == (f"applies at the next snapshot chunk of job orders_mv "
                    f"(currently in phase snapshot, chunk {done + 1}/{total})")


def test_alter_after_the_last_snapshot_chunk_applies_when_catch_up_starts(job_file, tables, capsys):
    progress = SnapshotProgress(epoch=3, chunks_total=2, rows_total=200, files_total=2)
    for index in range(progress.chunks_total):
        progress.done[index] = DoneChunk(index, f"data/c{index}", 100, 100, 0.1, 2, "run")
    save_progress(tables["target"], progress)
    assert alter(job_file, "--rate-limit", "10") == 0
    assert output_lines(capsys)[1] == ("applies when the catch-up of job orders_mv starts (the snapshot "
                                       f"has run all {progress.chunks_total} chunks and is being committed)")


def test_alter_during_catch_up_applies_at_its_next_round(job_file, tables, capsys):
    run_simulator(tables["source"], rows=50, epoch_interval=0, inserts=2, updates=3, deletes=1, seed=5,
                  max_epochs=4)
    watermark = 1
    write_mv_version(tables["target"], pa.table({"order_id": pa.array([1], pa.int64())}),
                     "airflow_backfill/orders_mv", watermark=watermark)
    rounds = [{"round": 1, "pending_epochs": 3}, {"round": 2, "pending_epochs": 2}]
    job_state.update_state(tables["target"], phase="catch_up", state="creating", catch_up_rounds=rounds)

    assert alter(job_file, "--rate-limit", "100") == 0
    pending = DeltaTable(tables["source"]).version() - watermark
    assert output_lines(capsys)[1] == (
        f"applies at the next catch-up round of job orders_mv (currently in phase catch_up, "
        f"round {len(rounds) + 1}, {pending} pending epochs)"
    )


def test_alter_between_snapshot_and_catch_up_applies_when_catch_up_starts(job_file, tables, capsys):
    write_mv_version(tables["target"], pa.table({"order_id": pa.array([1], pa.int64())}),
                     "airflow_backfill/orders_mv", watermark=7)
    job_state.update_state(tables["target"], phase="snapshot", state="creating", snapshot_epoch=7)
    assert alter(job_file, "--backfill-parallelism", "4") == 0
    assert output_lines(capsys)[1] == (
        "applies when the catch-up of job orders_mv starts (the snapshot is committed at epoch 7)"
    )


@pytest.mark.parametrize("phase", ["catch_up", "forward"])
def test_alter_after_the_backfill_is_stored_for_a_future_backfill(job_file, tables, capsys, phase):
    write_mv_version(tables["target"], pa.table({"order_id": pa.array([1], pa.int64())}),
                     "airflow_backfill/orders_mv", watermark=9)
    job_state.update_state(tables["target"], phase=phase, state="created", caught_up_epoch=9)
    assert alter(job_file, "--backfill-parallelism", "8") == 0
    when = output_lines(capsys)[1]
    assert when.startswith("stored for a future backfill: job orders_mv has finished its backfill "
                           f"(phase {phase}, watermark 9)")
    assert f"forward runs at parallelism {JOB_DEFAULTS['parallelism']}" in when
    assert read_overrides(tables["target"])["backfill_parallelism"] == 8


def test_a_damaged_control_file_is_an_error_that_reset_clears(job_file, tables, capsys):
    os.makedirs(os.path.dirname(control_path(tables["target"])), exist_ok=True)
    Path(control_path(tables["target"])).write_text("{not json")
    with pytest.raises(BackfillConfigError, match="is not valid JSON .*--reset"):
        effective_settings(load_job(job_file))
    assert alter(job_file, "--rate-limit", "5") == 2
    assert "--reset" in capsys.readouterr().err
    assert alter(job_file, "--reset") == 0
    assert read_overrides(tables["target"]) == {}


def test_hand_edited_overrides_are_validated_on_read(job_file, tables):
    os.makedirs(os.path.dirname(control_path(tables["target"])), exist_ok=True)
    Path(control_path(tables["target"])).write_text(json.dumps({"backfill_parallelism": 0}))
    with pytest.raises(BackfillConfigError, match="backfill_parallelism must be between 1 and 1024"):
        effective_settings(load_job(job_file))


# ---- the snapshot picks the change up at its next chunk ---------------------------------


@pytest.mark.spark
def test_the_snapshot_runs_the_chunks_after_an_alter_at_the_new_parallelism(spark, job_file, tables, monkeypatch):
    files, altered_after = 4, 2
    for index in range(files):
        ids = pa.array(range(index * 20, index * 20 + 20), pa.int64())
        write_deltalake(tables["source"], pa.table({"order_id": ids, "amount": pc.multiply(ids, 1.5)}),
                        mode="append", configuration={"delta.enableChangeDataFeed": "true"})
    job = load_job(job_file).with_overrides(rate_limit=None)
    new_parallelism = job.backfill_parallelism + 1

    def alter_between_chunks(phase: str, at: str) -> None:
        if at == f"after_chunks={altered_after}":
            assert main(["alter", "--job", str(job_file), "--backfill-parallelism", str(new_parallelism)]) == 0

    monkeypatch.setattr(snapshot_module, "maybe_crash", alter_between_chunks)
    run_snapshot(spark, job, chunk_bytes=1)

    progress = load_progress(tables["target"])
    assert progress is not None and progress.chunks_total == files
    used = [progress.done[index].parallelism for index in sorted(progress.done)]
    assert used == [job.backfill_parallelism] * altered_after + [new_parallelism] * (files - altered_after)
    commit = mv_commits(tables["target"])[-1]
    assert commit["airflow_backfill.chunk_parallelism"] == ",".join(map(str, used))


def test_alter_with_a_live_upstream_and_no_mv_waits_for_the_backfill(job_file, tables, capsys):
    """A live upstream without an MV: the override waits for the backfill's start."""
    create_orders_table(tables["source"], rows=10, seed=1)
    assert alter(job_file, "--rate-limit", "1000") == 0
    assert output_lines(capsys)[1].startswith("applies when the backfill of job orders_mv starts")
