"""The snapshot plans the upstream's files by their smallest key, so the chunks of an
upstream written in key order cover disjoint key ranges, and so do the MV files each
chunk writes, which a round's key bounds then prune with. Within its files the MV's rows
are sorted by its key, in files and Parquet row groups of bounded rows (`sizes`), for a
stateless MV, a join and a large aggregate; a small aggregate keeps Spark's layout."""

from __future__ import annotations

import json
import os
import random
from itertools import pairwise

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from join_upstreams import create_all, random_row, sources
from size_overrides import set_sizes

from airflow_backfill.engine.delta.log_state import table_state
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


def upstream_in_no_order(path: str) -> None:
    """Files of disjoint key ranges committed from the largest keys down, each holding its
    rows shuffled: nothing but the snapshot's own sort puts the MV's rows in key order."""
    rng = random.Random(3)
    for index in reversed(range(FILES)):
        keys = list(range(index * ROWS_PER_FILE, (index + 1) * ROWS_PER_FILE))
        rng.shuffle(keys)
        batch = pa.table({"id": pa.array(keys, pa.int64()), "amount": pa.array([float(k % 7) for k in keys])})
        write_deltalake(path, batch, mode="append", configuration={"delta.enableChangeDataFeed": "true"})


def mv_layout(uri: str, key: list[str]) -> list[tuple[int, list[int], bool]]:
    """Per MV file: its rows, its row groups' rows, and whether its rows are in key order."""
    state = table_state(uri)
    assert state is not None
    found = []
    for live in state.files:
        parquet = pq.ParquetFile(live.uri)
        rows = parquet.read(columns=key).to_pylist()
        keys = [tuple(row[column] for column in key) for row in rows]
        groups = [parquet.metadata.row_group(i).num_rows for i in range(parquet.num_row_groups)]
        found.append((len(rows), groups, keys == sorted(keys)))
    return found


def assert_laid_out(uri: str, key: list[str], file_rows: int, group_rows: int, rows: int) -> None:
    layout = mv_layout(uri, key)
    assert sum(count for count, _, _ in layout) == rows
    assert all(in_order for _, _, in_order in layout), layout
    assert max(count for count, _, _ in layout) <= file_rows, layout
    assert max(group for _, groups, _ in layout for group in groups) <= group_rows, layout
    assert len(layout) >= -(-rows // file_rows)


def test_the_mv_files_hold_rows_sorted_by_key_in_bounded_files_and_row_groups(spark, tables, monkeypatch):
    upstream_in_no_order(tables["source"])
    set_sizes(monkeypatch, mv_file_rows=25, mv_row_group_rows=8)
    job = BackfillJob(name="layout", query=QUERY, primary_key=["id"], backfill_parallelism=2, **tables)
    two_files = 2 * max(os.path.getsize(os.path.join(tables["source"], name))
                        for name in os.listdir(tables["source"]) if name.endswith(".parquet"))
    result = run_snapshot(spark, job, chunk_bytes=two_files)
    assert result.chunks_run == FILES // 2 and result.rows == FILES * ROWS_PER_FILE
    assert_laid_out(tables["target"], ["id"], 25, 8, result.rows)
    ranges = key_range_per_commit(tables["target"])
    assert all(high < next_low for (_, high), (next_low, _) in pairwise(ranges)), ranges
    assert_mv_matches(tables["source"], tables["target"], QUERY, job.app_id, key=["id"])


def test_without_bounds_the_mv_files_are_sparks_own(spark, tables, monkeypatch):
    """The switch the layout's figures are measured against: Spark's files, unsorted."""
    upstream_in_no_order(tables["source"])
    set_sizes(monkeypatch, mv_file_rows=0, mv_row_group_rows=0)
    job = BackfillJob(name="layout", query=QUERY, primary_key=["id"], backfill_parallelism=2, **tables)
    run_snapshot(spark, job)
    layout = mv_layout(tables["target"], ["id"])
    assert len(layout) <= 2 and not all(in_order for _, _, in_order in layout)
    assert_mv_matches(tables["source"], tables["target"], QUERY, job.app_id, key=["id"])


@pytest.mark.parametrize("large", [False, True], ids=["small aggregate", "large aggregate"])
def test_an_aggregate_mv_is_laid_out_only_when_its_rounds_do_not_hold_it_whole(spark, tables, monkeypatch, large):
    upstream_in_no_order(tables["source"])
    set_sizes(monkeypatch, mv_file_rows=2, mv_row_group_rows=1, **({"held_table_rows": 3} if large else {}))
    query = "SELECT amount, COUNT(*) AS n, SUM(id) AS total FROM source GROUP BY amount"
    job = BackfillJob(name="grouped", query=query, primary_key=["id"], backfill_parallelism=2, **tables)
    result = run_snapshot(spark, job)
    assert result.rows == 7
    if large:
        assert_laid_out(tables["target"], ["amount"], 2, 1, 7)
    else:  # held whole by its rounds: as many files as the write's tasks, not one per two rows
        assert len(mv_layout(tables["target"], ["amount"])) <= 2
    assert_mv_matches(tables["source"], tables["target"], query, job.app_id, key=["amount"])


@pytest.mark.parametrize("where", ["", " WHERE i.i_qty > 2"], ids=["chunk commits", "one commit"])
def test_a_join_mv_is_laid_out_by_its_key(spark, tmp_path, monkeypatch, where):
    joined = create_all(str(tmp_path), seed=5, names=("orders", "items"), sizes={"orders": 12, "items": 36})
    query = f"SELECT i.i_order, i.i_line, i.i_qty, o.o_status FROM items i JOIN orders o ON i.i_order = o.o_id{where}"
    set_sizes(monkeypatch, mv_file_rows=4, mv_row_group_rows=2)
    job = BackfillJob(name="joined", target=str(tmp_path / "mv"), query=query, sources=sources(joined),
                      backfill_parallelism=2)
    result = run_snapshot(spark, job)
    orders = {row["o_id"]: row for row in DeltaTable(joined["orders"].uri).to_pyarrow_table().to_pylist()}
    expected = sorted((item["i_order"], item["i_line"], item["i_qty"], orders[item["i_order"]]["o_status"])
                      for item in DeltaTable(joined["items"].uri).to_pyarrow_table().to_pylist()
                      if item["i_order"] in orders and (not where or (item["i_qty"] or 0) > 2))
    assert expected and result.rows == len(expected)
    assert_laid_out(job.target, ["i_order", "i_line"], 4, 2, len(expected))
    mv = spark.read.format("delta").load(job.target).collect()
    assert sorted((row["i_order"], row["i_line"], row["i_qty"], row["o_status"]) for row in mv) == expected
