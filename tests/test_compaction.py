"""A compaction of a patched MV changes nothing a reader sees: the same rows through Spark and
delta-rs, the same watermark, an empty change feed at its version, fewer files; a
concurrent commit that rewrites files fails it without losing anything, and an append
commits beside it; tables whose files carry more than their rows are left alone; files
mostly hidden by deletion vectors are rewritten while the driver's budget allows, and
named when it does not."""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pytest
from aggregate_upstream import apply_epoch, random_ops, values
from aggregate_upstream import create as create_upstream
from deltalake import DeltaTable, QueryBuilder
from helpers_delta import cycle_write_ways
from size_overrides import set_sizes
from test_keyed_writes import APP, changes, create, write_as
from test_mv_on_mv import forward_all, job

from airflow_backfill.engine.delta import commit_fence
from airflow_backfill.engine.delta.compaction import compact, compact_if_needed, hidden_share, select
from airflow_backfill.engine.delta.log_state import table_state
from airflow_backfill.engine.phases.snapshot import run_snapshot
from airflow_backfill.engine.planning.round_plan import PATCH
from oracle import assert_every_commit_matches

pytestmark = pytest.mark.spark

SCHEMA = "k long, v string, amount double"


def spark_rows(spark, uri: str) -> list[tuple]:
    return sorted(tuple(row) for row in spark.read.format("delta").load(uri).collect())


def delta_rs_rows(uri: str) -> list[tuple]:
    read = pa.table(QueryBuilder().register("t", DeltaTable(uri)).execute("SELECT k, v, amount FROM t").read_all())
    return sorted(tuple(row.values()) for row in read.to_pylist())


def feed_rows(spark, uri: str, version: int) -> list:
    return (spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", version)
            .option("endingVersion", version).load(uri)).collect()


def live_files(uri: str) -> int:
    return len(DeltaTable(uri).file_uris())


def patch_round(spark, uri: str, expected: dict, rng: random.Random, version: int) -> None:
    """A round of scattered upserts and deletes written as a patch, applied to `expected` too."""
    rows = []
    for key in rng.sample(range(1, 400), 12):
        if rng.random() < 0.25:
            rows.append((key, None, None, None))
            expected.pop(key, None)
        else:
            value = (key, f"r{version}", float(rng.randrange(1000)))
            rows.append((*value, True))
            expected[key] = value
    write_as(spark, PATCH, uri, changes(spark, rows, SCHEMA), version=version)


def patched_mv(spark, uri: str, seed: int) -> dict:
    """An MV of 199 rows after three patch rounds (watermark 3); its expected rows."""
    expected = {k: (k, f"v{k}", float(k)) for k in range(1, 200)}
    create(spark, uri, list(expected.values()), SCHEMA)
    rng = random.Random(seed)
    for version in range(1, 4):
        patch_round(spark, uri, expected, rng, version)
    return expected


def test_compaction_between_patch_rounds_keeps_rows_watermark_and_feed(spark, tmp_path, monkeypatch):
    uri = str(tmp_path / "mv")
    expected = {k: (k, f"v{k}", float(k)) for k in range(1, 300)}
    create(spark, uri, list(expected.values()), SCHEMA)
    set_sizes(monkeypatch, compact_files=3, small_file_bytes=1 << 20)
    rng = random.Random(5)
    compactions = 0
    for version in range(1, 9):
        patch_round(spark, uri, expected, rng, version)
        before = DeltaTable(uri).version()
        files_before = live_files(uri)
        compacted = compact_if_needed(spark, uri, ["k"])
        table = DeltaTable(uri)
        assert table.transaction_version(APP) == version  # the watermark did not move
        assert spark_rows(spark, uri) == sorted(expected.values())
        assert delta_rs_rows(uri) == sorted(expected.values())
        if not compacted:
            small = [live for live in table_state(uri).files if live.size < 1 << 20]
            assert table.version() == before and len(small) <= 3
            continue
        compactions += 1
        assert table.version() == before + 1
        assert live_files(uri) < files_before
        assert feed_rows(spark, uri, before + 1) == []
        assert table.history(limit=1)[0]["operation"] == "OPTIMIZE"
        actions = [json.loads(line) for line in (tmp_path / "mv" / "_delta_log" / f"{before + 1:020d}.json")
                   .read_text().splitlines()]
        assert not any("txn" in action for action in actions)
        assert all(action[kind]["dataChange"] is False for action in actions for kind in ("add", "remove")
                   if kind in action)
    assert compactions >= 2
    state = table_state(uri)
    assert state is not None and all(not live.deletion_vector for live in state.files if live.records == 0)


def test_a_compacted_file_holds_its_rows_sorted_by_key(spark, tmp_path, monkeypatch):
    uri = str(tmp_path / "mv")
    expected = {k: (k, f"v{k}", float(k)) for k in range(1, 300)}
    create(spark, uri, list(expected.values()), SCHEMA)
    set_sizes(monkeypatch, compact_files=2, small_file_bytes=1 << 20, mv_row_group_rows=32)
    rng = random.Random(9)
    for version in range(1, 4):
        patch_round(spark, uri, expected, rng, version)
    done = compact(spark, uri, ["k"])
    assert done is not None and done.added == 1 and done.rows == len(expected)
    state = table_state(uri)
    assert state is not None and len(state.files) == 1
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(state.files[0].uri)
    keys = parquet.read(columns=["k"]).column("k").to_pylist()
    assert keys == sorted(expected)
    assert all(parquet.metadata.row_group(i).num_rows <= 32 for i in range(parquet.num_row_groups))
    assert spark_rows(spark, uri) == sorted(expected.values())


def test_a_concurrent_commit_that_rewrites_files_fails_the_compaction_and_nothing_is_lost(spark, tmp_path,
                                                                                         monkeypatch):
    """Also once Delta's Python exceptions are registered (`delta.tables` imported, as the
    engine's maintenance does), so that the conflict arrives as PySpark's captured one."""
    import delta.tables  # noqa: F401

    uri = str(tmp_path / "mv")
    expected = patched_mv(spark, uri, seed=3)
    set_sizes(monkeypatch, compact_files=2, small_file_bytes=1 << 20)
    version_before = DeltaTable(uri).version()
    late: list[int] = []

    def another_round() -> None:  # a patch commits between the compaction's files and its commit
        if not late:
            late.append(1)
            write_as(spark, PATCH, uri, changes(spark, [(5, "late", 5.0, True)], SCHEMA), version=4)

    with commit_fence.at_each_commit(another_round):
        assert compact_if_needed(spark, uri, ["k"]) is False
    expected[5] = (5, "late", 5.0)
    table = DeltaTable(uri)
    assert table.version() == version_before + 1  # the other round's commit alone
    assert table.history(limit=1)[0]["operation"] != "OPTIMIZE"
    assert spark_rows(spark, uri) == sorted(expected.values()) == delta_rs_rows(uri)
    assert compact_if_needed(spark, uri, ["k"]) is True  # the next call compacts
    assert spark_rows(spark, uri) == sorted(expected.values()) == delta_rs_rows(uri)
    assert DeltaTable(uri).transaction_version(APP) == 4


def test_a_concurrent_append_keeps_its_file_beside_the_compaction(spark, tmp_path, monkeypatch):
    """Delta checks a commit that changes no row at snapshot isolation, as its own OPTIMIZE:
    an append that wins the race removes nothing the compaction read, so both commit."""
    uri = str(tmp_path / "mv")
    expected = patched_mv(spark, uri, seed=4)
    set_sizes(monkeypatch, compact_files=2, small_file_bytes=1 << 20)

    def another_writer() -> None:
        spark.createDataFrame([(1000, "late", 1.0)], SCHEMA).write.format("delta").mode("append").save(uri)

    with commit_fence.at_each_commit(another_writer):
        assert compact_if_needed(spark, uri, ["k"]) is True
    expected[1000] = (1000, "late", 1.0)
    assert DeltaTable(uri).history(limit=1)[0]["operation"] == "OPTIMIZE"
    assert spark_rows(spark, uri) == sorted(expected.values()) == delta_rs_rows(uri)


@pytest.mark.parametrize("layout", ["partitioned", "column mapping"])
def test_tables_whose_files_carry_more_than_rows_are_left_alone(spark, tmp_path, monkeypatch, layout):
    uri = str(tmp_path / "mv")
    set_sizes(monkeypatch, compact_files=1, small_file_bytes=1 << 30)
    for part in range(4):
        writer = spark.createDataFrame([(part * 10 + i, f"p{part % 2}", float(i)) for i in range(5)],
                                       SCHEMA).write.format("delta").mode("append")
        if layout == "partitioned":
            writer = writer.partitionBy("v")
        elif part == 0:
            writer = writer.option("delta.columnMapping.mode", "name").option("delta.minReaderVersion", "2") \
                .option("delta.minWriterVersion", "5")
        writer.save(uri)
    before = (DeltaTable(uri).version(), spark_rows(spark, uri))
    assert compact_if_needed(spark, uri, ["k"]) is False
    assert (DeltaTable(uri).version(), spark_rows(spark, uri)) == before


def test_files_mostly_hidden_by_deletion_vectors_are_rewritten_within_the_budget(spark, tmp_path, monkeypatch):
    uri = str(tmp_path / "mv")
    expected = {k: (k, f"v{k}", float(k)) for k in range(1, 301)}
    create(spark, uri, list(expected.values()), SCHEMA)
    sizes = [live.size for live in table_state(uri).files]
    deleted = [(k, None, None, None) for k in range(1, 301) if k % 3]  # two thirds of the rows
    write_as(spark, PATCH, uri, changes(spark, deleted, SCHEMA), version=1)
    for key, *_ in deleted:
        expected.pop(key)
    state = table_state(uri)
    hidden = [live for live in state.files if hidden_share(live) > 0.5]
    assert hidden, "the patch marked the rows in deletion vectors"

    set_sizes(monkeypatch, small_file_bytes=1, rewrite_deleted_share=0.5, compact_bytes=min(sizes) - 1)
    assert compact(spark, uri, ["k"]) is None  # larger than the driver's budget: left
    assert sorted(live.path for live in select(table_state(uri)).left) == sorted(live.path for live in hidden)

    set_sizes(monkeypatch, small_file_bytes=1, rewrite_deleted_share=0.5, compact_bytes=sum(sizes))
    done = compact(spark, uri, ["k"])
    assert done is not None and done.removed == len(hidden) and done.rows == len(expected)
    assert all(not live.deletion_vector for live in table_state(uri).files)
    assert spark_rows(spark, uri) == sorted(expected.values()) == delta_rs_rows(uri)
    assert feed_rows(spark, uri, done.version) == []
    assert DeltaTable(uri).transaction_version(APP) == 1


def test_an_mv_over_a_compacted_mv_follows_it_exactly(spark, tmp_path, monkeypatch):
    """Rounds compact the tables they wrote when small files pile up (`rounds/compact.py`);
    the compactions sit in the MV's log as versions that change nothing: an MV over it
    reads none of their rows and still matches it at every commit."""
    cycle_write_ways(monkeypatch, ("patch", "replace", "merge"))
    set_sizes(monkeypatch, compact_files=1, small_file_bytes=1 << 30)
    rng = random.Random(21)
    upstream = create_upstream(str(tmp_path / "upstream"), [values(rng) for _ in range(30)])
    query1 = "SELECT id, g, x * 2 AS x2, s FROM source"
    query2 = "SELECT g, COUNT(*) AS n, SUM(x2) AS sx FROM source GROUP BY g"
    mv1 = job("mv1", upstream.uri, str(tmp_path / "mv1"), query1, ["id"])
    mv2 = job("mv2", mv1.target, str(tmp_path / "mv2"), query2, ["id"])
    run_snapshot(spark, mv1)
    run_snapshot(spark, mv2)
    for _ in range(5):
        apply_epoch(upstream, random_ops(rng))
        forward_all(spark, mv1)
        forward_all(spark, mv2)
    operations = [entry["operation"] for entry in DeltaTable(mv1.target).history()]
    assert operations.count("OPTIMIZE") >= 2, operations
    assert_every_commit_matches(upstream.uri, mv1.target, query1, mv1.app_id, key=["id"])
    assert_every_commit_matches(mv1.target, mv2.target, query2, mv2.app_id, key=["g"])
    assert DeltaTable(mv2.target).transaction_version(mv2.app_id) == DeltaTable(mv1.target).version()
