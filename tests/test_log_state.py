"""A table's live files as the driver replays its log are the ones Delta's readers list:
after appends, MERGE, DELETE and UPDATE by delta-rs and by Spark (deletion vectors
included), from a checkpoint of either writer, at an older version, and for a table
recreated at the same path; a round parses each commit of its range once."""

from __future__ import annotations

import random
import shutil
from collections import Counter

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from test_appends import snapshotted_mv

from airflow_backfill.engine.delta import log_state
from airflow_backfill.engine.delta.log_state import commit_entry, table_state
from airflow_backfill.engine.phases.catch_up import run_catch_up
from airflow_backfill.simulator import commit_epoch


def _delta_rs_paths(uri: str, version: int | None = None) -> list[str]:
    return sorted(pa.table(DeltaTable(uri, version=version).get_add_actions(flatten=True)).column("path").to_pylist())


def _paths(uri: str, version: int | None = None) -> list[str]:
    state = table_state(uri, version)
    assert state is not None
    return sorted(live.path for live in state.files)


def test_delta_rs_commits_and_checkpoints_are_replayed(tmp_path):
    uri = str(tmp_path / "t")
    write_deltalake(uri, pa.table({"k": list(range(10)), "v": ["a"] * 10}),
                    configuration={"delta.enableChangeDataFeed": "true"})
    write_deltalake(uri, pa.table({"k": [10, 11], "v": ["b", "b"]}), mode="append")
    assert _paths(uri) == _delta_rs_paths(uri)
    table = DeltaTable(uri)
    table.merge(pa.table({"k": [3, 12], "v": ["m", "m"]}), "t.k = s.k", source_alias="s", target_alias="t") \
        .when_matched_update_all().when_not_matched_insert_all().execute()
    DeltaTable(uri).delete("k = 5")
    assert _paths(uri) == _delta_rs_paths(uri)  # kept state brought forward commit by commit
    DeltaTable(uri).create_checkpoint()
    DeltaTable(uri).update({"v": "'u'"}, predicate="k = 7")
    latest = DeltaTable(uri).version()
    from airflow_backfill.engine.delta import log_state

    log_state._states.clear()  # a process that never saw the table reads the checkpoint
    assert _paths(uri) == _delta_rs_paths(uri)
    assert table_state(uri).version == latest
    assert _paths(uri, 1) == _delta_rs_paths(uri, 1)  # an older version, from the first commit
    state = table_state(uri)
    assert sum(live.records for live in state.files) == DeltaTable(uri).to_pyarrow_table().num_rows


def test_a_table_recreated_at_the_same_path_is_read_anew(tmp_path):
    uri = str(tmp_path / "t")
    write_deltalake(uri, pa.table({"k": [1, 2]}))
    first = _paths(uri)
    shutil.rmtree(uri)
    write_deltalake(uri, pa.table({"k": [3, 4, 5]}))
    assert _paths(uri) == _delta_rs_paths(uri) != first
    assert commit_entry(uri, 0) is not None and commit_entry(uri, 1) is None


@pytest.mark.spark
def test_spark_commits_with_deletion_vectors_and_its_checkpoints_are_replayed(spark, tmp_path):
    uri = str(tmp_path / "t")
    (spark.range(0, 100).selectExpr("id", "id % 3 AS g").repartition(2).write.format("delta")
     .option("delta.enableDeletionVectors", "true").option("delta.checkpointInterval", "3").save(uri))
    spark.sql(f"DELETE FROM delta.`{uri}` WHERE id < 10")
    spark.sql(f"UPDATE delta.`{uri}` SET g = 9 WHERE id = 50")
    spark.sql(f"DELETE FROM delta.`{uri}` WHERE id = 60")  # a second vector for a file that has one
    spark.range(100, 110).selectExpr("id", "CAST(0 AS BIGINT) AS g").write.format("delta").mode("append").save(uri)
    state = table_state(uri)
    assert state.version == 4 and _paths(uri) == _delta_rs_paths(uri)
    live_rows = sum(live.live_records for live in state.files)
    assert live_rows == spark.read.format("delta").load(uri).count() == 100 - 10 - 1 + 10
    vectors = {live.path: live.deletion_vector for live in state.files if live.deletion_vector}
    from airflow_backfill.engine.delta import log_state

    log_state._states.clear()  # from the checkpoint at version 3 (interval 3) and commit 4
    assert {live.path: live.deletion_vector for live in table_state(uri).files if live.deletion_vector} == vectors


@pytest.mark.spark
def test_a_round_reads_each_commit_of_its_range_once(spark, tables, monkeypatch):
    """The range's commits are parsed once per process (`commit_entry`), however many
    stages of the round (feed, key check, plan, write) ask for their actions."""
    job, _ = snapshotted_mv(spark, tables, rows=200, seed=62)
    rng = random.Random(62)
    for _ in range(3):
        commit_epoch(job.source, rng, inserts=3, updates=4, deletes=2)
    reads: Counter[str] = Counter()
    read_text = log_state.files.read_text

    def counted(path: str, *args, **kwargs):
        if "/_delta_log/" in path and path.endswith(".json"):
            reads[path] += 1
        return read_text(path, *args, **kwargs)

    monkeypatch.setattr(log_state.files, "read_text", counted)
    result = run_catch_up(spark, job)

    assert result.watermark == DeltaTable(job.source).version()
    upstream_commits = {path: n for path, n in reads.items() if path.startswith(job.source + "/")}
    assert len(upstream_commits) >= 3 and max(upstream_commits.values()) == 1, upstream_commits
