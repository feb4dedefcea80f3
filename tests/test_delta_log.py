"""Reads of the Delta log that skip a table load: the latest version from the log's file
names, commit timestamps from commit entries, and tables followed commit by commit."""

from __future__ import annotations

import shutil

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from airflow_backfill.engine.delta.log import commit_timestamp, latest_version, load_table


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
    recreated = load_table(uri)
    assert recreated.version() == 1
    assert sorted(recreated.to_pyarrow_table()["v"].to_pylist()) == [7, 8]


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
