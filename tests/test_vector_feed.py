"""Commits without change files, deletion vectors' among them, read by the driver as
Delta's change-feed reader reads them.

Spark's DELETE on a table with deletion vectors writes no change file: Delta derives the
feed from the vectors. Over a Spark-written history (DELETEs of some rows of several
files, of every row of a file, a second DELETE of files that have a vector, UPDATE, MERGE,
appends, OPTIMIZE, REPLACE WHERE) of a table of many column types and NULLs, whose files
hold several row groups each, the driver's feed of every version range equals Spark's
`readChangeFeed` as a multiset, under a process time zone other than UTC; and so do its
answers about keys that gained rows, its count of the change rows and its key bounds.
Vectors the driver does not compare as Delta does, hand-made, are left to Spark, and a
vector file that is gone is reported as a vacuumed upstream."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from process_zone import python_in_zone

from airflow_backfill.engine.delta.change_feed import ARRIVING, CHANGE_TYPE, COMMIT_VERSION, read_change_feed
from airflow_backfill.engine.delta.deletion_vectors import deleted_rows, vector_path, write_vectors
from airflow_backfill.engine.delta.driver_feed import change_key_range, feed_in_driver, key_gained_rows
from airflow_backfill.engine.delta.driver_rows import is_local
from airflow_backfill.engine.delta.listed_feed import listed_feed
from airflow_backfill.engine.delta.log_state import commit_entry, table_state
from airflow_backfill.engine.delta.row_positions import RowSelection, groups_holding
from airflow_backfill.engine.delta.vector_changes import DELETE, commit_file_changes
from airflow_backfill.exceptions import UpstreamError

ROW_GROUP_BYTES = 4096
"""Parquet's row group size while the test's tables are written: a few hundred rows a group."""
ROWS = (
    "SELECT id, IF(id % 9 = 0, NULL, CAST(id % 4 AS INT)) AS grp, "
    "IF(id % 6 = 0, NULL, CAST(id * 1.2345 - 300 AS DECIMAL(20, 4))) AS amount, "
    "IF(id % 8 = 0, NULL, TIMESTAMP_SECONDS(id * 3203407 - 2000000000)) AS at, "
    "DATE_ADD(DATE '1899-12-30', CAST(id * 37 AS INT)) AS day, "
    "IF(id % 5 = 0, NULL, CONCAT('n', id)) AS name, "
    "IF(id % 10 = 0, NULL, CAST(id AS DOUBLE) / 3) AS score, "
    "IF(id % 4 = 0, NULL, id % 3 = 0) AS flag FROM range({low}, {high})"
)
KEYS = (["id"], ["grp", "name"])


@contextmanager
def small_row_groups(spark) -> Iterator[None]:
    """Spark writes Parquet files of several row groups in the block (the setting is the
    shared session's)."""
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    settings = {"parquet.block.size": str(ROW_GROUP_BYTES), "parquet.block.size.row.check.min": "10",
                "parquet.page.size.row.check.min": "10"}
    before = {key: conf.get(key) for key in settings}
    for key, value in settings.items():
        conf.set(key, value)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                conf.unset(key)
            else:
                conf.set(key, value)


def _append(spark, uri: str, low: int, high: int, *, create: bool = False) -> None:
    writer = spark.sql(ROWS.format(low=low, high=high)).coalesce(1).write.format("delta")
    if create:
        writer = writer.option("delta.enableDeletionVectors", "true").option("delta.enableChangeDataFeed", "true")
    writer.mode("overwrite" if create else "append").save(uri)


def _history(spark, uri: str) -> dict[str, int]:
    """The commits of the test's upstream; the version each named step made."""
    steps = {}
    _append(spark, uri, 0, 400, create=True)
    _append(spark, uri, 400, 800)
    _append(spark, uri, 800, 1000)
    steps["append"] = 2

    def run(name: str, statement: str) -> None:
        spark.sql(statement.format(t=f"delta.`{uri}`"))
        steps[name] = max(steps.values()) + 1

    run("delete some rows of each file", "DELETE FROM {t} WHERE id % 7 = 1")
    run("delete a file's every row and more rows of files with vectors",
        "DELETE FROM {t} WHERE id >= 800 OR id % 11 = 3")
    run("update", "UPDATE {t} SET name = CONCAT('u', id), amount = amount + 1 WHERE id % 13 = 4")
    run("merge", "MERGE INTO {t} t USING (SELECT id FROM range(0, 1200, 29)) s ON t.id = s.id "
        "WHEN MATCHED AND s.id % 2 = 0 THEN DELETE "
        "WHEN MATCHED THEN UPDATE SET flag = NOT coalesce(t.flag, false), at = NULL "
        "WHEN NOT MATCHED THEN INSERT (id, grp, amount, at, day, name, score, flag) "
        "VALUES (s.id, 7, 0.5, TIMESTAMP '2024-03-10 07:30:00', DATE '2024-02-29', NULL, -0.5, NULL)")
    _append(spark, uri, 2000, 2100)
    steps["append without vectors"] = max(steps.values()) + 1
    run("delete a file without a vector whole", "DELETE FROM {t} WHERE id >= 2000")
    run("optimize", "OPTIMIZE {t}")
    run("delete rows of the compacted file", "DELETE FROM {t} WHERE id % 17 = 5")
    run("delete again in a file with a vector", "DELETE FROM {t} WHERE id % 19 = 6")
    run("replace where", f"INSERT INTO {{t}} REPLACE WHERE id < 100 {ROWS.format(low=50, high=120)} WHERE id < 100")
    return steps


def _values(table: pa.Table) -> Counter:
    return Counter(tuple(row.values()) for row in table.to_pylist())


def _in_versions(feed: pa.Table, watermark: int, end: int) -> pa.Table:
    """The rows of versions (watermark, end] of a feed read for a wider range."""
    versions = feed.column(COMMIT_VERSION)
    return feed.filter(pc.and_(pc.greater(versions, watermark), pc.less_equal(versions, end)))


def _commit(uri: str, version: int) -> list[dict]:
    entry = commit_entry(uri, version)
    assert entry is not None
    return entry


@pytest.mark.spark
def test_every_range_of_a_history_with_deletion_vectors_is_read_by_the_driver_as_spark_reads_it(spark, tmp_path):
    from airflow_backfill.engine.rounds.changes import some_key_gained_rows

    uri = str(tmp_path / "t")
    with small_row_groups(spark):
        steps = _history(spark, uri)
    latest = max(steps.values())

    # The history holds the shapes under test: vectors without change files, on files of
    # several row groups, marked beyond the first group; a file removed whole under its
    # vector; a second vector holding the first.
    marked = [action for action in _commit(uri, steps["delete some rows of each file"]) if "add" in action]
    assert marked and all(action["add"]["deletionVector"] for action in marked)
    assert not any("cdc" in action for action in _commit(uri, steps["delete some rows of each file"]))
    first = table_state(uri, steps["delete some rows of each file"]).files[0]
    groups = groups_holding(pq.read_metadata(first.uri), RowSelection.at(deleted_rows(uri, first.deletion_vector)))
    assert groups is not None and len(groups) > 1 and groups[-1] > 0
    again = commit_file_changes(uri, _commit(uri, steps["delete a file's every row and more rows of files with vectors"]))
    assert {(change.change_type, change.selection.inverted) for change in again} == {(DELETE, True), (DELETE, False)}
    whole = commit_file_changes(uri, _commit(uri, steps["delete a file without a vector whole"]))
    assert [(change.change_type, change.selection) for change in whole] == [(DELETE, None)]

    spark_feed = read_change_feed(spark, uri, 0, latest).cache()
    try:
        every = spark_feed.toArrow()
        with python_in_zone("America/New_York"):
            for watermark in range(latest):
                for end in range(watermark + 1, latest + 1):
                    held = feed_in_driver(spark, uri, watermark, end)
                    assert held is not None and is_local(held.frame), (watermark, end)
                    in_range = _in_versions(every, watermark, end)
                    assert held.table.schema == every.schema
                    assert _values(held.table) == _values(in_range), (watermark, end)
                    arriving = pc.sum(pc.is_in(in_range.column(CHANGE_TYPE), pa.array(ARRIVING))).as_py() or 0
                    assert (held.rows, held.arriving) == (in_range.num_rows, arriving)
            for watermark, end in ((0, latest), (steps["update"], steps["delete again in a file with a vector"])):
                expected = read_change_feed(spark, uri, watermark, end)  # the range read by Spark itself
                assert _values(feed_in_driver(spark, uri, watermark, end).table) == _values(expected.toArrow())
                some = ["at", "id", "amount"]
                expected, held = read_change_feed(spark, uri, watermark, end, some), feed_in_driver(
                    spark, uri, watermark, end, some)
                assert held.frame.schema == expected.schema
                assert Counter(held.frame.collect()) == Counter(expected.collect())  # local times both

            answers = set()
            single = [steps[name] for name in ("delete some rows of each file", "append without vectors",
                                               "delete a file without a vector whole", "replace where")]
            for watermark, end in [(version - 1, version) for version in single] + [(0, latest), (2, 9)]:
                for key in KEYS:
                    feed = spark_feed.where(f"{COMMIT_VERSION} > {watermark} AND {COMMIT_VERSION} <= {end}")
                    spark_says = some_key_gained_rows(feed, key)
                    assert key_gained_rows(uri, watermark, end, key) is spark_says, (watermark, end, key)
                    answers.add(spark_says)
            assert answers == {True, False}

            for watermark, end in ((2, 3), (2, 4), (9, 11)):
                feed = spark_feed.where(f"{COMMIT_VERSION} > {watermark} AND {COMMIT_VERSION} <= {end}")
                low, high, count = feed.selectExpr("min(id)", "max(id)", "count(*)").first()
                bounds = change_key_range(uri, watermark, end, "id")
                assert bounds is not None and bounds.rows == count
                assert bounds.low <= low and bounds.high >= high and not bounds.has_nulls
    finally:
        spark_feed.unpersist()


@pytest.mark.spark
def test_whole_files_removed_without_vectors_are_read_by_spark_from_the_listed_files(spark, tmp_path):
    uri = str(tmp_path / "t")
    _append(spark, uri, 0, 50, create=True)
    _append(spark, uri, 50, 90)
    spark.sql(f"DELETE FROM delta.`{uri}` WHERE id >= 50")  # a file without a vector removed whole
    spark.sql(f"DELETE FROM delta.`{uri}` WHERE id = 3")  # a vector
    columns = ["id", "at", "name"]
    listed = listed_feed(spark, uri, 1, 2, columns)
    expected = read_change_feed(spark, uri, 1, 2, columns)
    assert listed is not None and not is_local(listed.frame)
    assert _values(listed.frame.toArrow()) == _values(expected.toArrow())
    assert (listed.rows, listed.arriving) == (40, 0)
    assert listed_feed(spark, uri, 2, 3, columns) is None  # the vector's rows: Delta's reader filters them
    assert feed_in_driver(spark, uri, 2, 3, columns) is not None


def _hand_made_commit(uri: str, version: int, actions: list[dict]) -> None:
    lines = [{"commitInfo": {"operation": "DELETE", "timestamp": 0}}, *actions]
    Path(uri, "_delta_log", f"{version:020d}.json").write_text("\n".join(json.dumps(line) for line in lines) + "\n")


@pytest.mark.spark
def test_vectors_the_driver_does_not_compare_as_delta_does_are_left_to_spark(spark, tmp_path):
    uri = str(tmp_path / "t")
    _append(spark, uri, 0, 60, create=True)
    spark.sql(f"DELETE FROM delta.`{uri}` WHERE id IN (3, 4)")
    assert feed_in_driver(spark, uri, 0, 1) is not None
    (live,) = table_state(uri, 1).files
    (other,) = write_vectors(uri, [np.array([4, 9], np.uint64)])  # drops 3 again: not a superset
    _hand_made_commit(uri, 2, [{"remove": {**live.add, "dataChange": True}},
                               {"add": {**live.add, "deletionVector": other}}])
    without = {key: value for key, value in live.add.items() if key != "deletionVector"}
    _hand_made_commit(uri, 3, [{"remove": {**without, "dataChange": True}}, {"add": without}])  # no vectors
    for watermark in (1, 2):
        assert feed_in_driver(spark, uri, watermark, watermark + 1) is None, watermark
        assert key_gained_rows(uri, watermark, watermark + 1, ["id"]) is None
        assert change_key_range(uri, watermark, watermark + 1, "id") is None
        assert listed_feed(spark, uri, watermark, watermark + 1, ["id"]) is None


@pytest.mark.spark
def test_a_vacuumed_deletion_vector_is_the_same_error_as_a_vacuumed_data_file(spark, tmp_path):
    uri = str(tmp_path / "t")
    _append(spark, uri, 0, 60, create=True)
    spark.sql(f"DELETE FROM delta.`{uri}` WHERE id = 3")
    spark.sql(f"DELETE FROM delta.`{uri}` WHERE id = 4")  # its feed compares the vector of version 1
    (removed,) = [action["remove"] for action in _commit(uri, 2) if "remove" in action]
    Path(vector_path(uri, removed["deletionVector"])).unlink()
    with pytest.raises(UpstreamError, match="vacuumed"):
        feed_in_driver(spark, uri, 1, 2)
