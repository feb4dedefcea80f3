"""Reads of the Delta log that skip a table load: the latest version from the log's file
names, commit timestamps from commit entries, and tables followed commit by commit."""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, write_deltalake

from airflow_backfill.engine.delta import log
from airflow_backfill.engine.delta.log import commit_timestamp, latest_version, load_table, table_at
from airflow_backfill.kafka.positions import source_position


def _write(uri: str, values: list[int], mode: str = "append") -> None:
    write_deltalake(uri, pa.table({"v": pa.array(values, pa.int64())}), mode=mode)


def test_latest_version_and_commit_times_match_a_full_load(tmp_path):
    uri = str(tmp_path / "t")
    for start in range(0, 12, 3):
        _write(uri, [start, start + 1])
    DeltaTable(uri).create_checkpoint()
    _write(uri, [99])
    table = DeltaTable(uri)
    assert latest_version(uri) == table.version() == 4
    assert commit_timestamp(uri, 4) == table.history(limit=1)[0]["timestamp"]
    assert commit_timestamp(uri, 40) is None


def test_a_loaded_table_follows_new_commits_and_notices_a_recreated_table(tmp_path):
    uri = str(tmp_path / "t")
    _write(uri, [1])
    first = load_table(uri)
    _write(uri, [2])
    followed = load_table(uri)
    assert followed is first and followed.version() == 1
    assert sorted(followed.to_pyarrow_table()["v"].to_pylist()) == [1, 2]

    shutil.rmtree(uri)  # deleted and recreated at the same path, up to the same version
    _write(uri, [7])
    _write(uri, [8])
    at_version = table_at(uri, 1)
    assert at_version is not first and sorted(at_version.to_pyarrow_table()["v"].to_pylist()) == [7, 8]
    recreated = load_table(uri)
    assert recreated.version() == 1
    assert sorted(recreated.to_pyarrow_table()["v"].to_pylist()) == [7, 8]


def test_a_loaded_table_is_not_updated_until_a_commit_follows_it_and_versions_reuse_it(tmp_path, monkeypatch):
    uri = str(tmp_path / "t")
    _write(uri, [1])
    first = load_table(uri)
    updates = []
    monkeypatch.setattr(DeltaTable, "update_incremental", lambda table: updates.append(table.version()))
    assert load_table(uri) is first and updates == []  # no next commit file: nothing to read
    assert table_at(uri, 0) is first and table_at(uri) is first
    monkeypatch.undo()
    _write(uri, [2])
    assert load_table(uri) is first and first.version() == 1  # the next commit file: followed
    older = table_at(uri, 0)
    assert older is not first and older.version() == 0 and older.to_pyarrow_table()["v"].to_pylist() == [1]
    assert table_at(uri, 1) is first

    shutil.rmtree(uri)  # recreated at the same path, at the version loaded
    _write(uri, [7])
    _write(uri, [8])
    again = table_at(uri, 1)
    assert again is not first and sorted(again.to_pyarrow_table()["v"].to_pylist()) == [7, 8]
    assert sorted(load_table(uri).to_pyarrow_table()["v"].to_pylist()) == [7, 8]


def test_a_rarely_checkpointed_log_is_flagged(tmp_path, caplog):
    import pyarrow as pa
    from deltalake import PostCommitHookProperties, write_deltalake

    from airflow_backfill.engine.delta.log import UNCHECKPOINTED_COMMITS_WARNING, warn_if_rarely_checkpointed

    never, often = str(tmp_path / "never"), str(tmp_path / "often")
    for index in range(UNCHECKPOINTED_COMMITS_WARNING + 3):
        batch = pa.table({"v": [index]})
        write_deltalake(never, batch, mode="append",
                        post_commithook_properties=PostCommitHookProperties(create_checkpoint=False))
        write_deltalake(often, batch, mode="append", configuration={"delta.checkpointInterval": "10"})
    with caplog.at_level("WARNING"):
        assert warn_if_rarely_checkpointed(often) <= 10
        assert "commits after its last checkpoint" not in caplog.text
        assert warn_if_rarely_checkpointed(never) == UNCHECKPOINTED_COMMITS_WARNING + 3  # every commit
    assert "Set delta.checkpointInterval" in caplog.text


def _commit_offsets(uri: str, offset: int) -> None:
    """An append whose commit records a source job's offset, as the source job's commits do."""
    metadata = json.dumps({"airflow_backfill.kafka_offsets": {"0": offset}})
    write_deltalake(uri, pa.table({"v": pa.array([offset], pa.int64())}), mode="append",
                    commit_properties=CommitProperties(custom_metadata={"userMetadata": metadata}))


def test_positions_name_the_version_of_their_commit_when_a_commit_lands_during_the_read(tmp_path, monkeypatch):
    """delta-rs numbers a listing from the version it loaded: a commit landing between the
    load and the listing must not pair offset 3 with version 2 (whose rows stop at 2)."""
    uri = str(tmp_path / "t")
    for offset in range(3):
        _commit_offsets(uri, offset)
    loads = []

    def a_commit_lands_after_the_first_load(path: str, version: int | None = None) -> DeltaTable:
        table = DeltaTable(path, version=version)
        loads.append(table.version())
        if len(loads) == 1:
            _commit_offsets(uri, 3)
        return table

    monkeypatch.setattr(log, "delta_table", a_commit_lands_after_the_first_load)
    position = source_position(uri)
    assert loads == [2, 3]
    assert (position.version, position.offsets) == (3, {0: 3})
    assert [entry["version"] for entry in log.commit_history(uri)] == [3, 2, 1, 0]
    rows = DeltaTable(uri, version=position.version).to_pyarrow_table()["v"].to_pylist()
    assert max(rows) == position.offsets[0]
