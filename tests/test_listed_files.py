"""A small table is read, overwritten, replaced and deleted from the file list its
checksum carries: the rows, the change feed and the watermark are those Delta's own
reader, overwrite, replace and DELETE give, a concurrent commit still fails the
overwrite, and tables whose checksum lists no files fall back to Delta's reader and
writer."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder

from airflow_backfill.engine.delta import transaction_write
from airflow_backfill.engine.delta.commits import TABLE_PROPERTIES
from airflow_backfill.engine.delta.listed_files import listed_files, read_table
from airflow_backfill.engine.delta.log import load_table
from airflow_backfill.engine.delta.transaction_write import APPEND, OVERWRITE, write_with_watermark
from airflow_backfill.engine.internals import latest_snapshot
from airflow_backfill.engine.sizes import sizes

pytestmark = pytest.mark.spark

APP = "airflow_backfill/listed-files-test"
SCHEMA = "k long, v string"


_LISTED_THRESHOLD = "spark.databricks.delta.allFilesInCrc.thresholdNumFiles"


def _create(spark, uri: str, rows: list[tuple], *, files: int = 1) -> None:
    writer = spark.createDataFrame(rows, SCHEMA).repartition(files).write.format("delta")
    for key, value in TABLE_PROPERTIES.items():
        writer = writer.option(key, value)
    writer.option("txnAppId", APP).option("txnVersion", "0").save(uri)


def _rows(frame) -> list[tuple]:
    return sorted(tuple(row) for row in frame.collect())


def _feed(spark, uri: str, version: int) -> list[tuple]:
    feed = (spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", version)
            .option("endingVersion", version).load(uri))
    return sorted((row["_change_type"], row["k"], row["v"]) for row in feed.collect())


@pytest.fixture
def listed_overwrites(monkeypatch) -> list[int]:
    """Counts the overwrites made from a checksum's file list."""
    calls: list[int] = []
    original = transaction_write._overwrite_listed

    def counted(*args):
        calls.append(1)
        return original(*args)

    monkeypatch.setattr(transaction_write, "_overwrite_listed", counted)
    return calls


def test_a_small_table_is_read_and_overwritten_from_its_listed_files(spark, tmp_path, listed_overwrites):
    uri = str(tmp_path / "t")
    _create(spark, uri, [(1, "a"), (2, "b"), (3, "c")])
    write_with_watermark(spark.createDataFrame([(4, "d")], SCHEMA), uri, mode=APPEND, options={}, app_id=APP,
                         version=1, user_metadata="{}")
    spark.sql(f"DELETE FROM delta.`{uri}` WHERE k = 2")  # marks the row in a deletion vector
    _, snapshot = latest_snapshot(spark, uri)
    assert listed_files(snapshot).size() == 2
    assert _rows(read_table(spark, uri)) == [(1, "a"), (3, "c"), (4, "d")]
    assert _rows(read_table(spark, uri, 1)) == [(1, "a"), (2, "b"), (3, "c"), (4, "d")]  # time travel

    new = spark.createDataFrame([(1, "a"), (5, "e")], SCHEMA)
    assert write_with_watermark(new, uri, mode=OVERWRITE, options={}, app_id=APP, version=3, user_metadata='{"n": 3}')
    assert listed_overwrites == [1]
    assert _rows(read_table(spark, uri)) == [(1, "a"), (5, "e")]
    assert _rows(spark.read.format("delta").load(uri)) == [(1, "a"), (5, "e")]
    assert _feed(spark, uri, 3) == [("delete", 1, "a"), ("delete", 3, "c"), ("delete", 4, "d"),
                                    ("insert", 1, "a"), ("insert", 5, "e")]
    table = DeltaTable(uri)
    assert table.transaction_version(APP) == 3
    assert table.history(1)[0]["userMetadata"] == '{"n": 3}'
    assert not write_with_watermark(new, uri, mode=OVERWRITE, options={}, app_id=APP, version=3, user_metadata="{}")


@pytest.mark.parametrize("rival", ["append", "delete"])
def test_a_concurrent_commit_fails_an_overwrite_from_listed_files(spark, tmp_path, monkeypatch, listed_overwrites,
                                                                  rival):
    """Another writer appends a row, or deletes one, after the overwrite pinned its read
    version: the overwrite must fail rather than leave the appended row behind or remove
    a file twice."""
    uri = str(tmp_path / "t")
    _create(spark, uri, [(1, "a"), (2, "b")])
    expected = {"append": [(1, "a"), (2, "b"), (9, "rival")], "delete": [(2, "b")]}[rival]

    def watermark_then_a_rival_commit(path: str):
        seen = load_table(path)
        if rival == "append":
            spark.createDataFrame([(9, "rival")], SCHEMA).write.format("delta").mode("append").save(path)
        else:
            spark.sql(f"DELETE FROM delta.`{path}` WHERE k = 1")
        return seen

    monkeypatch.setattr(transaction_write, "load_table", watermark_then_a_rival_commit)
    with pytest.raises(Exception, match="Concurrent|concurrent"):
        write_with_watermark(spark.createDataFrame([(3, "c")], SCHEMA), uri, mode=OVERWRITE, options={},
                             app_id=APP, version=1, user_metadata="{}")
    assert listed_overwrites == [1]
    assert _rows(spark.read.format("delta").load(uri)) == expected
    assert DeltaTable(uri).transaction_version(APP) == 0


def test_the_engines_sessions_list_the_files_of_tables_beyond_deltas_default(spark, tmp_path):
    """Delta lists a version's files in its checksum below 50 files by default; the engine's
    sessions raise that, so an MV keeps its list as its rounds add files."""
    uri = str(tmp_path / "sixty")
    _create(spark, uri, [(k, str(k)) for k in range(120)], files=60)
    _, snapshot = latest_snapshot(spark, uri)
    assert listed_files(snapshot).size() == 60 < sizes().listed_files


def test_tables_whose_checksum_lists_no_files_and_other_columns_go_through_delta(spark, tmp_path, listed_overwrites):
    many = str(tmp_path / "many")
    spark.conf.set(_LISTED_THRESHOLD, "50")  # Delta's default: the checksum lists no file of 60
    try:
        _create(spark, many, [(k, str(k)) for k in range(120)], files=60)
    finally:
        spark.conf.set(_LISTED_THRESHOLD, str(sizes().listed_files))
    _, snapshot = latest_snapshot(spark, many)
    assert listed_files(snapshot) is None
    assert len(read_table(spark, many).collect()) == 120
    write_with_watermark(spark.createDataFrame([(1, "x")], SCHEMA), many, mode=OVERWRITE, options={}, app_id=APP,
                         version=1, user_metadata="{}")
    assert _rows(read_table(spark, many)) == [(1, "x")]

    few = str(tmp_path / "few")
    _create(spark, few, [(1, "a")])
    swapped = spark.createDataFrame([("z", 7)], "v string, k long")  # Delta's writer matches columns by name
    write_with_watermark(swapped, few, mode=OVERWRITE, options={}, app_id=APP, version=1, user_metadata="{}")
    assert _rows(read_table(spark, few)) == [(7, "z")]
    assert listed_overwrites == []


def test_a_small_tables_rows_read_by_the_driver_are_sparks(spark, tmp_path):
    from airflow_backfill.engine.delta.listed_files import listed_rows

    uri = str(tmp_path / "typed")
    rows = spark.sql(
        "SELECT id AS k, CAST(id * 1.5 AS DECIMAL(12,2)) AS d, DATE_ADD(DATE '2024-02-27', CAST(id AS INT)) AS day, "
        "TIMESTAMP '2024-03-31 01:30:00' + MAKE_INTERVAL(0, 0, 0, 0, id, 0, 0) AS at, "
        "IF(id = 2, NULL, CONCAT('v', id)) AS s FROM range(5)")
    writer = rows.repartition(2).write.format("delta")
    for key, value in TABLE_PROPERTIES.items():
        writer = writer.option(key, value)
    writer.save(uri)
    current = read_table(spark, uri)
    held = listed_rows(spark, uri, 0, current.schema)
    assert held is not None and held.sort_by("k").equals(current.toArrow().sort_by("k"))
    assert listed_rows(spark, uri, 0, current.select("s", "k").schema).column_names == ["s", "k"]
    assert listed_rows(spark, uri, None, current.schema).equals(held)  # None: whichever version is the latest
    spark.sql(f"DELETE FROM delta.`{uri}` WHERE k = 3")  # a deletion vector: left to Spark
    assert listed_rows(spark, uri, 1, read_table(spark, uri).schema) is None
    assert listed_rows(spark, uri, 0, current.schema) is None  # not the latest version


LITERAL_REPLACES = [
    ("(`k` = CAST(2 AS BIGINT)) OR (`k` = CAST(12 AS BIGINT))", [(2, "two"), (12, "twelve")]),
    ("(`k` = CAST(3 AS BIGINT))", [(3, "three")]),  # a file that has a deletion vector already
    ("(`k` = CAST(4 AS BIGINT)) OR (`k` = CAST(99 AS BIGINT))", []),  # a delete, one key not held
]
"""Replaces by conditions of literals, as `keyed_writes` makes them: condition, new rows."""


@pytest.mark.parametrize("from_list", [True, False], ids=["listed", "delta"])
def test_a_replace_or_delete_from_listed_files_leaves_what_deltas_own_leaves(spark, tmp_path, monkeypatch, from_list):
    """The rows, each version's change feed, delta-rs' view and the watermark are the same
    whether the replaced rows are marked from the checksum's list or by Delta's own
    replace and DELETE: by literals, by a semi-join, a file emptied, a file that has a
    deletion vector already, and a retried version."""
    from airflow_backfill.engine.delta.commits import delete_keys, replace_keys, replace_matching

    taken: list[bool] = []
    original = transaction_write.replace_listed

    def spied(*args):
        actions = original(*args) if from_list else None
        taken.append(actions is not None)
        return actions

    monkeypatch.setattr(transaction_write, "replace_listed", spied)
    uri = str(tmp_path / "t")
    _create(spark, uri, [(k, f"v{k}") for k in range(1, 11)])
    write_with_watermark(spark.createDataFrame([(k, f"v{k}") for k in range(11, 16)], SCHEMA), uri, mode=APPEND,
                         options={}, app_id=APP, version=1, user_metadata="{}")
    watermark = {"app_id": APP, "user_metadata": "{}"}
    for version, (condition, rows) in enumerate(LITERAL_REPLACES, start=2):
        replace_matching(spark.createDataFrame(rows, SCHEMA), uri, condition, version=version, **watermark)
    replace_keys(spark.createDataFrame([(5, "five"), (13, "thirteen")], SCHEMA), uri, ("k",), None, version=5,
                 null_safe=False, **watermark)
    delete_keys(spark.createDataFrame([(k,) for k in (11, 12, 13, 14, 15, 77)], "k long"), uri, ("k",),
                "`__mv`.`k` BETWEEN 11 AND 77", version=6, null_safe=False, **watermark)
    replace_keys(spark.createDataFrame([(6, "again")], SCHEMA), uri, ("k",), None, version=6, null_safe=False,
                 **watermark)  # a retry of a committed version: nothing written

    expected = {k: f"v{k}" for k in range(1, 11) if k != 4}
    expected.update({2: "two", 3: "three", 5: "five"})
    assert taken == [from_list] * 5
    assert _rows(spark.read.format("delta").load(uri)) == sorted(expected.items())
    read_by_delta_rs = QueryBuilder().register("t", DeltaTable(uri)).execute("SELECT k, v FROM t ORDER BY k")
    assert pa.table(read_by_delta_rs.read_all()).to_pylist() == [{"k": k, "v": v} for k, v in sorted(expected.items())]
    assert [_feed(spark, uri, version) for version in range(2, 7)] == [
        [("delete", 2, "v2"), ("delete", 12, "v12"), ("insert", 2, "two"), ("insert", 12, "twelve")],
        [("delete", 3, "v3"), ("insert", 3, "three")],
        [("delete", 4, "v4")],
        [("delete", 5, "v5"), ("delete", 13, "v13"), ("insert", 5, "five"), ("insert", 13, "thirteen")],
        [("delete", 11, "v11"), ("delete", 12, "twelve"), ("delete", 13, "thirteen"), ("delete", 14, "v14"),
         ("delete", 15, "v15")],
    ]
    assert DeltaTable(uri).transaction_version(APP) == 6
    assert DeltaTable(uri).version() == 6
