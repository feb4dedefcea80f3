"""A snapshot interrupted after some chunks resumes with only the remaining chunks (the MV's
log says which are committed), the MV has no watermark until the snapshot's last commit,
and nothing of a failed attempt is ever referenced."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet  # noqa: F401  (pa.parquet)
import pytest
from deltalake import DeltaTable, write_deltalake

from airflow_backfill.engine.delta.log import read_watermark
from airflow_backfill.engine.phases import snapshot as snapshot_module
from airflow_backfill.engine.phases.snapshot import run_snapshot
from airflow_backfill.engine.snapshot_chunks import run as chunk_run
from airflow_backfill.engine.snapshot_chunks.progress import load_progress
from airflow_backfill.engine.writer_lock import writer_lock
from airflow_backfill.exceptions import TargetError, UpstreamError
from airflow_backfill.job import BackfillJob
from oracle import assert_mv_matches, table_rows

pytestmark = pytest.mark.spark

QUERY = "SELECT order_id, amount * 2 AS doubled FROM source WHERE amount > 10"


class Killed(Exception):
    """Stands in for SIGKILL inside the test process."""


def upstream_with_files(path: str, files: int, rows_per_file: int = 50) -> None:
    for index in range(files):
        start = index * rows_per_file
        batch = pa.table({
            "order_id": pa.array(range(start, start + rows_per_file), pa.int64()),
            "amount": pa.array([float(i % 40) for i in range(start, start + rows_per_file)]),
        })
        write_deltalake(path, batch, mode="append", configuration={"delta.enableChangeDataFeed": "true"})


def job_for(tables: dict[str, str]) -> BackfillJob:
    return BackfillJob(name="resume", query=QUERY, primary_key=["order_id"], **tables)


def crash_at(monkeypatch, point: str) -> None:
    def fake_crash(phase: str, at: str) -> None:
        if at == point:
            raise Killed(at)

    monkeypatch.setattr(chunk_run, "maybe_crash", fake_crash)


def test_rerun_after_a_crash_redoes_only_the_chunks_in_flight(spark, tables, monkeypatch):
    upstream_with_files(tables["source"], files=5)
    job = job_for(tables)
    crash_at(monkeypatch, "after_chunks=2")
    with pytest.raises(Killed):
        run_snapshot(spark, job, chunk_bytes=1)
    assert read_watermark(tables["target"], job.app_id) is None, "a half snapshot has a watermark"
    assert DeltaTable(tables["target"]).transaction_version(job.app_id) is None
    first = load_progress(tables["target"])
    assert first is not None and sorted(first.done) == [0, 1]

    monkeypatch.undo()
    result = run_snapshot(spark, job, chunk_bytes=1)
    assert result.chunks_run == 3
    progress = load_progress(tables["target"])
    assert {progress.done[i].run_id for i in (0, 1)} == {first.done[0].run_id}
    assert len({progress.done[i].run_id for i in (2, 3, 4)}) == 1
    assert progress.done[2].run_id != first.done[0].run_id
    assert_mv_matches(tables["source"], tables["target"], QUERY, job.app_id, key=["order_id"])


@pytest.mark.parametrize("record", ["this_version", "older_record"])
def test_a_resumed_snapshot_proves_the_key_only_when_its_record_lacks_the_proof(spark, tables, monkeypatch, record):
    upstream_with_files(tables["source"], files=4)
    job = job_for(tables)
    crash_at(monkeypatch, "after_chunks=2")
    with pytest.raises(Killed):
        run_snapshot(spark, job, chunk_bytes=1)
    monkeypatch.undo()
    first = load_progress(tables["target"])
    assert first is not None and first.key_proved
    if record == "older_record":  # written before the field was kept: chunks may precede a proof
        path = os.path.join(tables["target"], "_airflow_backfill", "snapshot.json")
        data = json.loads(open(path).read())
        del data["key_proved"]
        open(path, "w").write(json.dumps(data))

    proofs = []
    real_proof = snapshot_module._upstream_key_repeated
    monkeypatch.setattr(snapshot_module, "_upstream_key_repeated", lambda *args: proofs.append(1) or real_proof(*args))
    result = run_snapshot(spark, job, chunk_bytes=1)
    assert result.chunks_run == 2
    assert len(proofs) == (0 if record == "this_version" else 1)
    assert_mv_matches(tables["source"], tables["target"], QUERY, job.app_id, key=["order_id"])


def test_files_of_a_crashed_attempt_are_never_referenced(spark, tables, monkeypatch):
    upstream_with_files(tables["source"], files=3)
    job = job_for(tables)
    crash_at(monkeypatch, "after_write")
    with pytest.raises(Killed):
        run_snapshot(spark, job, chunk_bytes=1)
    stray = os.path.join(tables["target"], "part-00000-crashed-attempt.snappy.parquet")
    pa.parquet.write_table(pa.table({"order_id": pa.array([1], pa.int64()), "doubled": [1.0]}), stray)

    monkeypatch.undo()
    result = run_snapshot(spark, job, chunk_bytes=1)
    assert result.chunks_run == 0  # every chunk was committed before the crash
    referenced = {os.path.normpath(uri.removeprefix("file://")) for uri in DeltaTable(tables["target"]).file_uris()}
    assert stray not in referenced and len(referenced) >= 3
    assert_mv_matches(tables["source"], tables["target"], QUERY, job.app_id, key=["order_id"])


def test_a_second_writer_is_refused_while_one_holds_the_mv(spark, tables):
    upstream_with_files(tables["source"], files=1)
    job = job_for(tables)
    with writer_lock(tables["target"], job.name, "catch_up"):
        with pytest.raises(TargetError, match="another run of job resume is writing the MV .*catch_up phase, pid"):
            run_snapshot(spark, job)
    assert not os.path.isdir(os.path.join(tables["target"], "_delta_log"))
    assert run_snapshot(spark, job).skipped is False


@pytest.mark.parametrize(("query", "amount", "reason"), [
    (QUERY, 30.0, r"order_id=17 is held 2 times at epoch 2"),
    (QUERY, 5.0, r"order_id=17 is held 2 times at epoch 2"),  # the second row filtered out of the MV
    ("SELECT order_id, amount * 2 AS doubled FROM source", 30.0, r"order_id=17 is held 2 times at epoch 2"),
], ids=["where", "where_second_row_filtered", "no_where"])
def test_duplicate_primary_key_is_refused_before_anything_is_written(
    spark, tables, monkeypatch, query, amount, reason,
):
    upstream_with_files(tables["source"], files=2)
    duplicate = pa.table({"order_id": pa.array([17], pa.int64()), "amount": pa.array([amount])})
    write_deltalake(tables["source"], duplicate, mode="append")
    job = BackfillJob(name="resume", query=query, primary_key=["order_id"], **tables)

    def no_chunk(*args, **kwargs):
        raise AssertionError("a chunk was written before the key was proved")

    monkeypatch.setattr(chunk_run, "run_chunk", no_chunk)
    with pytest.raises(UpstreamError, match="not unique in the upstream: " + reason):
        run_snapshot(spark, job, chunk_bytes=1)
    assert not os.path.isdir(os.path.join(tables["target"], "_delta_log"))
    leftovers = [name for name in os.listdir(tables["target"]) if name != "_airflow_backfill"]
    assert leftovers == [], "the chunks of the refused snapshot were left in the MV's folder"


def test_a_key_the_files_prove_is_not_counted_by_spark_and_one_they_cannot_is(spark, tables, monkeypatch, caplog):
    upstream_with_files(tables["source"], files=3)
    spark_proofs = []
    real_proof = snapshot_module.duplicate_key
    monkeypatch.setattr(snapshot_module, "duplicate_key", lambda *args: spark_proofs.append(1) or real_proof(*args))
    job = job_for(tables)
    with caplog.at_level("INFO", logger="airflow_backfill.engine.delta.key_proof"):
        run_snapshot(spark, job, chunk_bytes=1)
    assert spark_proofs == [] and "proved unique at epoch 2 from the files' key ranges" in caplog.text
    assert_mv_matches(tables["source"], tables["target"], QUERY, job.app_id, key=["order_id"])

    # Keys too far apart for a bitmap, in runs that overlap (a trillion, then 150 to a trillion
    # and one): unique still, but only Spark can tell.
    far = 10**12
    write_deltalake(tables["source"], pa.table({"order_id": pa.array([far, 150, far + 1], pa.int64()),
                                                "amount": [30.0, 40.0, 50.0]}), mode="append")
    again = BackfillJob(name="resume_again", query=QUERY, primary_key=["order_id"], source=tables["source"],
                        target=tables["target"] + "_again")
    run_snapshot(spark, again, chunk_bytes=1)
    assert spark_proofs == [1]
    assert_mv_matches(tables["source"], again.target, QUERY, again.app_id, key=["order_id"])


def test_an_unverified_primary_key_is_taken_as_declared(spark, tables, caplog):
    upstream_with_files(tables["source"], files=2)
    duplicate = pa.table({"order_id": pa.array([17], pa.int64()), "amount": pa.array([30.0])})
    write_deltalake(tables["source"], duplicate, mode="append")
    job = job_for(tables).with_overrides(verify_primary_key=False)
    with caplog.at_level("INFO", logger="airflow_backfill.engine.phases.snapshot"):
        result = run_snapshot(spark, job, chunk_bytes=1)
    assert result.skipped is False and "not verified (verify_primary_key: false)" in caplog.text
    assert table_rows(tables["target"]).column("order_id").to_pylist().count(17) == 2


def test_an_empty_upstream_gives_an_empty_mv_with_its_watermark(spark, tables):
    empty = pa.table({"order_id": pa.array([], pa.int64()), "amount": pa.array([], pa.float64())})
    write_deltalake(tables["source"], empty, configuration={"delta.enableChangeDataFeed": "true"})
    job = job_for(tables)
    result = run_snapshot(spark, job)
    assert (result.epoch, result.rows) == (0, 0)
    assert read_watermark(tables["target"], job.app_id) == 0 and table_rows(tables["target"]).num_rows == 0
