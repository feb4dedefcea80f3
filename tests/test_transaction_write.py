"""A write through the engine's own Delta transaction commits what the writer options
`txnAppId` / `txnVersion` would: data, app transaction and userMetadata in one log entry;
it skips a version the table already records, and loses to a concurrent commit of the
same app transaction instead of committing the version twice."""

from __future__ import annotations

import json

import pytest
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from airflow_backfill.engine.delta import transaction_write
from airflow_backfill.engine.delta.commits import TABLE_PROPERTIES
from airflow_backfill.engine.delta.log import load_table
from airflow_backfill.engine.delta.transaction_write import (
    APPEND,
    OVERWRITE,
    commit_watermark,
    write_with_watermark,
)

pytestmark = pytest.mark.spark

APP = "airflow_backfill/transaction-test"


def _create(spark, uri: str) -> None:
    writer = spark.createDataFrame([(1, "a"), (2, "b")], "k long, v string").write.format("delta")
    for key, value in TABLE_PROPERTIES.items():
        writer = writer.option(key, value)
    writer.option("txnAppId", APP).option("txnVersion", "0").save(uri)


def _entry(uri: str, version: int) -> list[dict]:
    with open(f"{uri}/_delta_log/{version:020d}.json") as log_file:
        return [json.loads(line) for line in log_file]


def _rows(spark, uri: str) -> list[tuple]:
    return sorted(tuple(row) for row in spark.read.format("delta").load(uri).collect())


def test_appends_replaces_and_overwrites_commit_their_rows_with_the_watermark_and_metadata(spark, tmp_path):
    uri = str(tmp_path / "t")
    _create(spark, uri)
    frame = spark.createDataFrame([(3, "c")], "k long, v string")
    assert write_with_watermark(frame, uri, mode=APPEND, options={}, app_id=APP, version=5, user_metadata='{"n": 1}')
    changes = spark.createDataFrame([(2, "B")], "k long, v string").alias("c").select("*")
    assert write_with_watermark(changes, uri, mode=OVERWRITE, options={"replaceOn": "t.k = c.k", "targetAlias": "t"},
                                app_id=APP, version=7, user_metadata='{"n": 2}')
    assert _rows(spark, uri) == [(1, "a"), (2, "B"), (3, "c")]
    entry = _entry(uri, 2)
    assert {"appId": APP, "version": 7} == {k: v for k, v in next(a["txn"] for a in entry if "txn" in a).items()
                                             if k in ("appId", "version")}
    info = next(a["commitInfo"] for a in entry if "commitInfo" in a)
    assert info["userMetadata"] == '{"n": 2}'
    assert info["operationParameters"]["replaceOnCond"] == "t.k = c.k"
    assert not info["isBlindAppend"]
    whole = spark.createDataFrame([(9, "z")], "k long, v string")
    assert write_with_watermark(whole, uri, mode=OVERWRITE, options={}, app_id=APP, version=8, user_metadata="{}")
    assert _rows(spark, uri) == [(9, "z")]
    assert commit_watermark(spark, uri, app_id=APP, version=9, user_metadata='{"n": 4}')
    assert not commit_watermark(spark, uri, app_id=APP, version=9, user_metadata="{}")
    assert [sorted(action) for action in _entry(uri, 4)] == [["commitInfo"], ["txn"]]
    assert _rows(spark, uri) == [(9, "z")]
    table = DeltaTable(uri)
    assert table.transaction_version(APP) == 9
    assert [h["operation"] for h in table.history()] == ["WRITE"] * 5
    assert table.history(1)[0]["userMetadata"] == '{"n": 4}'


def test_a_version_the_table_records_is_not_written_again(spark, tmp_path):
    uri = str(tmp_path / "t")
    _create(spark, uri)
    frame = spark.createDataFrame([(3, "c")], "k long, v string")
    assert write_with_watermark(frame, uri, mode=APPEND, options={}, app_id=APP, version=4, user_metadata="{}")
    for version in (4, 3):
        assert not write_with_watermark(frame, uri, mode=APPEND, options={}, app_id=APP, version=version,
                                        user_metadata="{}")
    assert DeltaTable(uri).version() == 1
    assert _rows(spark, uri) == [(1, "a"), (2, "b"), (3, "c")]


def test_a_concurrent_commit_of_the_same_app_transaction_fails_the_write(spark, tmp_path, monkeypatch):
    """The other writer commits the same version after this write pinned its read version
    and read the watermark: the write must fail rather than apply the version twice."""
    uri = str(tmp_path / "t")
    _create(spark, uri)

    def stale_watermark_then_a_rival_commit(path: str):
        seen = load_table(path)
        stale = DeltaTable(path, version=seen.version())
        (spark.createDataFrame([(4, "rival")], "k long, v string").write.format("delta").mode("append")
         .option("txnAppId", APP).option("txnVersion", "5").save(path))
        return stale

    monkeypatch.setattr(transaction_write, "load_table", stale_watermark_then_a_rival_commit)
    frame = spark.createDataFrame([(3, "c")], "k long, v string")
    with pytest.raises(Exception, match="ConcurrentTransactionException|concurrent update"):
        write_with_watermark(frame, uri, mode=APPEND, options={}, app_id=APP, version=5, user_metadata="{}")
    assert _rows(spark, uri) == [(1, "a"), (2, "b"), (4, "rival")]
    assert DeltaTable(uri).version() == 1


def test_a_concurrent_commit_of_another_app_does_not_conflict(spark, tmp_path, monkeypatch):
    uri = str(tmp_path / "t")
    _create(spark, uri)

    def watermark_then_another_apps_commit(path: str):
        seen = load_table(path)
        (spark.createDataFrame([(4, "other")], "k long, v string").write.format("delta").mode("append")
         .option("txnAppId", "someone-else").option("txnVersion", "1").save(path))
        return seen

    monkeypatch.setattr(transaction_write, "load_table", watermark_then_another_apps_commit)
    frame = spark.createDataFrame([(3, "c")], "k long, v string")
    assert write_with_watermark(frame, uri, mode=APPEND, options={}, app_id=APP, version=5, user_metadata="{}")
    assert _rows(spark, uri) == [(1, "a"), (2, "b"), (3, "c"), (4, "other")]
    assert DeltaTable(uri).transaction_version(APP) == 5


def test_a_first_write_creates_the_table_as_deltas_writer_does(spark, tmp_path):
    """`append(create=True)` goes through the engine's transaction: its first log entry has
    what Delta's writer makes of the same write with the table properties as options."""
    from airflow_backfill.engine.delta.commits import append

    by_writer, by_transaction = str(tmp_path / "writer"), str(tmp_path / "transaction")
    _create(spark, by_writer)
    frame = spark.createDataFrame([(1, "a"), (2, "b")], "k long, v string")
    assert append(frame, by_transaction, app_id=APP, version=0, user_metadata="{}", create=True)
    assert not append(frame, by_transaction, app_id=APP, version=0, user_metadata="{}", create=True)  # recorded

    def actions(uri: str) -> dict[str, dict]:
        entry = {name: body for action in _entry(uri, 0) for name, body in action.items() if name != "add"}
        for volatile in (("metaData", "id"), ("metaData", "createdTime"), ("txn", "lastUpdated")):
            entry[volatile[0]].pop(volatile[1])
        return {name: entry[name] for name in ("metaData", "protocol", "txn")}

    assert actions(by_transaction) == actions(by_writer)
    assert DeltaTable(by_transaction).version() == 0 and _rows(spark, by_transaction) == [(1, "a"), (2, "b")]
    with pytest.raises(TableNotFoundError, match="no Delta table"):  # a write that does not create never does
        write_with_watermark(frame, str(tmp_path / "missing"), mode=APPEND, options={}, app_id=APP, version=0,
                             user_metadata="{}")
