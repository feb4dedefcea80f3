"""The snapshot plans the upstream's files by their smallest key, so the chunks of an
upstream written in key order cover disjoint key ranges, and so do the MV files each
chunk writes, which a round's key bounds then prune with."""

from __future__ import annotations

import json
import os
import random
from itertools import pairwise

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from join_upstreams import create_all, random_row, sources

from airflow_backfill.engine.phases.snapshot import run_snapshot
from airflow_backfill.engine.snapshot_chunks import plan as snapshot_chunks
from airflow_backfill.engine.snapshot_chunks import run as snapshot_module
from airflow_backfill.engine.snapshot_chunks.plan import (
    KEY_ORDER,
    PATH_ORDER,
    DataFile,
    default_chunk_bytes,
    file_order,
)
from airflow_backfill.engine.snapshot_chunks.progress import PROGRESS_FILE, load_progress
from airflow_backfill.job import BackfillJob
from airflow_backfill.spark_jobs import snapshot as snapshot_command
from oracle import assert_mv_matches

pytestmark = pytest.mark.spark

QUERY = "SELECT id, amount * 2 AS doubled FROM source WHERE amount >= 0"
FILES = 8
ROWS_PER_FILE = 40


def upstream_written_newest_first(path: str) -> None:
    """Files of disjoint key ranges, committed from the largest keys down, so that neither
    commit order nor (random) file names follow the keys."""
    for index in reversed(range(FILES)):
        start = index * ROWS_PER_FILE
        batch = pa.table({"id": pa.array(range(start, start + ROWS_PER_FILE), pa.int64()),
                          "amount": pa.array([float(i % 7) for i in range(ROWS_PER_FILE)])})
        write_deltalake(path, batch, mode="append", configuration={"delta.enableChangeDataFeed": "true"})


def key_range_per_commit(uri: str) -> list[tuple[int, int]]:
    """The key range of the files each commit of the Delta table at `uri` added, in key order."""
    ranges = []
    log_dir = os.path.join(uri, "_delta_log")
    for name in sorted(n for n in os.listdir(log_dir) if n.endswith(".json")):
        with open(os.path.join(log_dir, name)) as handle:
            stats = [json.loads(json.loads(line)["add"]["stats"]) for line in handle if '"add"' in line]
        stats = [entry for entry in stats if entry["numRecords"]]
        if stats:
            ranges.append((min(e["minValues"]["id"] for e in stats), max(e["maxValues"]["id"] for e in stats)))
    return sorted(ranges)


def test_each_chunk_covers_a_key_range_of_its_own(spark, tables):
    upstream_written_newest_first(tables["source"])
    job = BackfillJob(name="layout", query=QUERY, primary_key=["id"], **tables)
    two_files = 2 * max(os.path.getsize(os.path.join(tables["source"], name))
                        for name in os.listdir(tables["source"]) if name.endswith(".parquet"))
    result = run_snapshot(spark, job, chunk_bytes=two_files)
    assert result.chunks_run == FILES // 2
    ranges = key_range_per_commit(tables["target"])
    assert len(ranges) == FILES // 2
    assert all(high < next_low for (_, high), (next_low, _) in pairwise(ranges)), ranges
    assert_mv_matches(tables["source"], tables["target"], QUERY, job.app_id, key=["id"])


def test_an_unfinished_snapshot_planned_in_another_order_starts_over(spark, tables, monkeypatch):
    upstream_written_newest_first(tables["source"])
    job = BackfillJob(name="layout", query=QUERY, primary_key=["id"], **tables)

    class Killed(Exception):
        pass

    def crash(phase: str, at: str) -> None:
        if at == "after_chunks=2":
            raise Killed(at)

    monkeypatch.setattr(snapshot_module, "maybe_crash", crash)
    with pytest.raises(Killed):
        run_snapshot(spark, job, chunk_bytes=1)
    progress_path = os.path.join(tables["target"], "_airflow_backfill", PROGRESS_FILE)
    with open(progress_path) as handle:
        record = json.load(handle)
    assert record.pop("file_order") == KEY_ORDER
    with open(progress_path, "w") as handle:
        json.dump(record, handle)  # as a version that planned by path wrote it
    assert load_progress(tables["target"]).file_order == PATH_ORDER

    monkeypatch.undo()
    result = run_snapshot(spark, job, chunk_bytes=1)
    assert result.chunks_run == FILES
    assert_mv_matches(tables["source"], tables["target"], QUERY, job.app_id, key=["id"])


def test_files_without_key_statistics_keep_path_order():
    assert file_order([DataFile("b", 1, 1, key_min=3), DataFile("a", 1, 1, key_min=None)]) == PATH_ORDER
    assert file_order([DataFile("b", 1, 1, key_min=3), DataFile("a", 1, 1, key_min=5)]) == KEY_ORDER
    assert file_order([]) == PATH_ORDER


def test_a_join_snapshot_defaults_to_the_join_chunk_size(spark, tmp_path, monkeypatch):
    """A join's chunk reads the other upstreams too, so its default chunk is larger: with
    the defaults shrunk to tell them apart, a join with no `chunk_bytes` plans its largest
    upstream's two files by the join default, not by the one-upstream default."""
    tables = create_all(str(tmp_path), seed=5, names=("orders", "items"))
    items = tables["items"]
    extra = [random_row("items", random.Random(5), (100, 0))]
    write_deltalake(items.uri, pa.Table.from_pylist(extra, schema=items.schema), mode="append")
    query = "SELECT o.o_cust, COUNT(*) AS n FROM orders o JOIN items i ON i.i_order = o.o_id GROUP BY o.o_cust"
    job = BackfillJob(name="joined", target=str(tmp_path / "mv"), query=query, sources=sources(tables))
    monkeypatch.setattr(snapshot_chunks, "DEFAULT_CHUNK_BYTES", 1 << 30)
    monkeypatch.setattr(snapshot_chunks, "DEFAULT_JOIN_CHUNK_BYTES", 1)
    assert run_snapshot(spark, job).chunks_run == 2


def test_the_snapshot_command_leaves_the_chunk_size_to_the_job_kind():
    assert snapshot_command.parse_args(["--job", "job.yaml"]).chunk_bytes is None
    assert snapshot_command.parse_args(["--job", "job.yaml", "--chunk-bytes", "4096"]).chunk_bytes == 4096
    with pytest.raises(SystemExit):
        snapshot_command.parse_args(["--job", "job.yaml", "--chunk-bytes", "0"])
    assert default_chunk_bytes(is_join=True) > default_chunk_bytes(is_join=False)
