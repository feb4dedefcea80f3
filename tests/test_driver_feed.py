"""A small change feed read by the driver from its files, and a larger one read by Spark
from the files its log lists, give the rows, types and change types Spark's change feed
reader gives, for appends, deletes (deletion vectors' too, tests/test_vector_feed.py),
updates and merges; ranges of other shapes, or above the limits, are left to Spark's
reader."""

from __future__ import annotations

import pytest

from airflow_backfill.engine.delta.change_feed import CHANGE_TYPE, COMMIT_VERSION, read_change_feed
from airflow_backfill.engine.delta.commits import DELETION_VECTORS_PROPERTY, TABLE_PROPERTIES
from airflow_backfill.engine.delta.driver_feed import ChangeKeyRange, change_key_range, feed_in_driver
from airflow_backfill.engine.delta.driver_rows import is_local
from airflow_backfill.engine.delta.listed_feed import listed_feed
from airflow_backfill.engine.delta.log import commit_actions
from airflow_backfill.engine.sizes import overridden
from airflow_backfill.exceptions import UpstreamError

pytestmark = pytest.mark.spark

COLUMNS = "k long, d decimal(18,2), day date, at timestamp, s string, f double"


def _create(spark, uri: str, *, deletion_vectors: bool = True) -> None:
    rows = spark.sql(
        "SELECT id AS k, CAST(id * 1.25 AS DECIMAL(18,2)) AS d, DATE_ADD(DATE '2020-01-01', CAST(id AS INT)) AS day, "
        "TIMESTAMP '2021-03-04 05:06:07' + MAKE_INTERVAL(0, 0, 0, 0, 0, 0, id) AS at, "
        "IF(id % 3 = 0, NULL, CONCAT('s', id)) AS s, id / 7 AS f FROM range(20)")
    writer = rows.repartition(2).write.format("delta")
    for key, value in {**TABLE_PROPERTIES, DELETION_VECTORS_PROPERTY: str(deletion_vectors).lower()}.items():
        writer = writer.option(key, value)
    writer.save(uri)


def _rows(frame) -> list[tuple]:
    return sorted((tuple(row) for row in frame.collect()), key=repr)


def _types(frame) -> list[tuple]:
    return [(field.name, field.dataType) for field in frame.schema.fields]


def _spark_feed(spark, uri: str, watermark: int, end: int, columns: list[str] | None):
    return read_change_feed(spark, uri, watermark, end, columns)


def test_appends_deletes_updates_and_merges_read_as_spark_reads_them(spark, tmp_path):
    uri = str(tmp_path / "t")
    _create(spark, uri, deletion_vectors=False)  # row-level changes then write change files
    spark.sql(f"INSERT INTO delta.`{uri}` VALUES (100, 1.50, DATE '1999-12-31', TIMESTAMP '2001-02-03 04:05:06', "
              "NULL, NULL)")
    spark.sql(f"DELETE FROM delta.`{uri}` WHERE k IN (2, 5)")
    spark.sql(f"UPDATE delta.`{uri}` SET s = 'updated', d = d + 1 WHERE k = 7")
    spark.sql(f"MERGE INTO delta.`{uri}` t USING (SELECT 8 AS k UNION ALL SELECT 200) s ON t.k = s.k "
              "WHEN MATCHED THEN DELETE WHEN NOT MATCHED THEN INSERT (k, d, day, at, s, f) "
              "VALUES (s.k, 2.00, DATE '2024-02-29', TIMESTAMP '2024-02-29 23:59:59', 'merged', -0.5)")
    for columns in (None, ["k", "s", "at"]):
        held = feed_in_driver(spark, uri, 0, 4, columns)
        assert held is not None and is_local(held.frame)
        expected = _spark_feed(spark, uri, 0, 4, columns)
        assert held.frame.schema == expected.schema
        assert _rows(held.frame) == _rows(expected)
        assert held.rows == expected.count()
        assert held.arriving == expected.filter(f"{CHANGE_TYPE} IN ('insert', 'update_postimage')").count()
    assert [f.name for f in held.upstream.fields] == ["k", "d", "day", "at", "s", "f"]
    kinds = {row[CHANGE_TYPE] for row in held.frame.select(CHANGE_TYPE).collect()}
    assert kinds == {"insert", "delete", "update_preimage", "update_postimage"}
    assert {row[COMMIT_VERSION] for row in held.frame.select(COMMIT_VERSION).collect()} == {1, 2, 3, 4}


def test_large_ranges_and_other_metadata_are_left_to_spark(spark, tmp_path):
    uri = str(tmp_path / "t")
    _create(spark, uri)
    spark.sql(f"INSERT INTO delta.`{uri}` SELECT * FROM delta.`{uri}`")
    assert feed_in_driver(spark, uri, 0, 1, limit=19) is None  # 20 rows appended
    held = feed_in_driver(spark, uri, 0, 1, limit=20)
    assert held is not None and held.rows == held.arriving == 20
    spark.sql(f"DELETE FROM delta.`{uri}` WHERE k = 4")  # deletion vectors, with no change files
    assert feed_in_driver(spark, uri, 1, 2, limit=1) is None  # the rows the vectors mark count, 2
    held = feed_in_driver(spark, uri, 1, 2, limit=2)
    assert held is not None and _rows(held.frame) == _rows(_spark_feed(spark, uri, 1, 2, None))
    marked = sum(action["add"]["size"] for action in commit_actions(uri, 2) if "add" in action)
    with overridden(feed_bytes=marked - 1):  # the row groups holding the rows count, not the files
        assert feed_in_driver(spark, uri, 1, 2) is not None
    with overridden(feed_bytes=0):
        assert feed_in_driver(spark, uri, 1, 2) is None
    spark.sql(f"DELETE FROM delta.`{uri}`")  # removes whole files, with no change files either
    held = feed_in_driver(spark, uri, 2, 3)
    assert held is not None and _rows(held.frame) == _rows(_spark_feed(spark, uri, 2, 3, None))
    spark.sql(f"ALTER TABLE delta.`{uri}` ADD COLUMNS (extra int)")
    assert feed_in_driver(spark, uri, 0, 1) is None  # the latest metadata is not the range's


def test_listed_files_read_by_spark_give_the_change_feed_and_its_count(spark, tmp_path):
    uri = str(tmp_path / "t")
    _create(spark, uri, deletion_vectors=False)
    spark.sql(f"INSERT INTO delta.`{uri}` VALUES (100, 1.50, DATE '1999-12-31', TIMESTAMP '2001-02-03 04:05:06', "
              "NULL, NULL)")
    spark.sql(f"INSERT INTO delta.`{uri}` SELECT k + 200, d, day, at, s, f FROM delta.`{uri}` WHERE k < 3")
    spark.sql(f"DELETE FROM delta.`{uri}` WHERE k IN (2, 5)")
    spark.sql(f"UPDATE delta.`{uri}` SET s = 'updated', d = d + 1 WHERE k = 7")
    spark.sql(f"MERGE INTO delta.`{uri}` t USING (SELECT 8 AS k UNION ALL SELECT 300) s ON t.k = s.k "
              "WHEN MATCHED THEN DELETE WHEN NOT MATCHED THEN INSERT (k, d, day, at, s, f) "
              "VALUES (s.k, 2.00, DATE '2024-02-29', TIMESTAMP '2024-02-29 23:59:59', 'merged', -0.5)")
    for watermark, end in ((0, 2), (0, 5), (3, 4), (4, 5)):
        for columns in (["k", "d", "day", "at", "s", "f"], ["s", "k"]):
            listed = listed_feed(spark, uri, watermark, end, columns)
            assert listed is not None and not is_local(listed.frame)
            expected = _spark_feed(spark, uri, watermark, end, columns)
            assert _types(listed.frame) == _types(expected)  # the feed's own columns may be non-nullable
            assert _rows(listed.frame) == _rows(expected), (watermark, end, columns)
            assert listed.rows == expected.count()
            assert listed.arriving == expected.filter(f"{CHANGE_TYPE} IN ('insert', 'update_postimage')").count()
    assert [f.name for f in listed.upstream.fields] == ["k", "d", "day", "at", "s", "f"]
    assert listed_feed(spark, uri, 0, 5, ["k", "no_such_column"]) is None


def test_listed_files_leave_other_shapes_to_the_change_feed_reader(spark, tmp_path):
    uri = str(tmp_path / "t")
    _create(spark, uri)
    spark.sql(f"DELETE FROM delta.`{uri}` WHERE k = 4")  # a deletion vector, with no change files
    assert listed_feed(spark, uri, 0, 1, ["k"]) is None
    spark.sql(f"DELETE FROM delta.`{uri}`")  # removes whole files, with no change files either
    assert listed_feed(spark, uri, 1, 2, ["k"]) is None
    spark.sql(f"INSERT INTO delta.`{uri}` VALUES (1, 1.00, NULL, NULL, NULL, NULL)")
    assert listed_feed(spark, uri, 2, 3, ["k"]) is not None
    spark.sql(f"ALTER TABLE delta.`{uri}` ADD COLUMNS (extra int)")
    assert listed_feed(spark, uri, 2, 3, ["k"]) is None  # the latest metadata is not the range's
    widened = str(tmp_path / "widened")
    spark.sql(f"CREATE TABLE delta.`{widened}` (k int) USING delta TBLPROPERTIES "
              "('delta.enableChangeDataFeed' = 'true', 'delta.enableTypeWidening' = 'true')")
    spark.sql(f"INSERT INTO delta.`{widened}` VALUES (1)")
    spark.sql(f"ALTER TABLE delta.`{widened}` ALTER COLUMN k TYPE bigint")
    spark.sql(f"INSERT INTO delta.`{widened}` VALUES (2)")
    assert listed_feed(spark, widened, 0, 3, ["k"]) is None  # old files hold the narrower type


def test_a_vacuumed_change_file_is_the_same_error_as_with_spark(spark, tmp_path):
    uri = str(tmp_path / "t")
    _create(spark, uri, deletion_vectors=False)
    spark.sql(f"DELETE FROM delta.`{uri}` WHERE k = 3")
    for change_file in (tmp_path / "t" / "_change_data").iterdir():
        change_file.unlink()
    with pytest.raises(UpstreamError, match="vacuumed"):
        feed_in_driver(spark, uri, 0, 1)
    with pytest.raises(UpstreamError, match="vacuumed"):
        listed_feed(spark, uri, 0, 1, ["k"])


def test_the_driver_tells_a_key_that_gained_rows_as_spark_tells_it(spark, tmp_path):
    from airflow_backfill.engine.delta.driver_feed import key_gained_rows
    from airflow_backfill.engine.rounds.changes import some_key_gained_rows

    uri = str(tmp_path / "t")
    _create(spark, uri, deletion_vectors=False)
    spark.sql(f"UPDATE delta.`{uri}` SET d = d + 1 WHERE k < 5")  # 1: rows keep their keys
    spark.sql(f"DELETE FROM delta.`{uri}` WHERE k = 9")  # 2
    spark.sql(f"UPDATE delta.`{uri}` SET k = 11 WHERE k = 10")  # 3: key 11 now held twice
    spark.sql(f"UPDATE delta.`{uri}` SET k = 9 WHERE k = 12")  # 4: moved onto the key 2 deleted
    cases = {(0, 2): False, (0, 3): True, (3, 4): True, (1, 4): True}
    for (watermark, end), gained in cases.items():
        for key in (["k"], ["k", "s"]):
            spark_says = some_key_gained_rows(read_change_feed(spark, uri, watermark, end, key), key)
            assert key_gained_rows(uri, watermark, end, key) is spark_says, (watermark, end, key)
            if key == ["k"]:
                assert spark_says is gained, (watermark, end)
    with_vectors = str(tmp_path / "dv")
    _create(spark, with_vectors)
    spark.sql(f"DELETE FROM delta.`{with_vectors}` WHERE k = 1")  # a deletion vector, no change files
    spark.sql(f"INSERT INTO delta.`{with_vectors}` VALUES (1, 1.00, NULL, NULL, NULL, NULL)")
    for (watermark, end), gained in {(0, 1): False, (0, 2): False, (1, 2): True}.items():
        spark_says = some_key_gained_rows(read_change_feed(spark, with_vectors, watermark, end, ["k"]), ["k"])
        assert key_gained_rows(with_vectors, watermark, end, ["k"]) is spark_says is gained, (watermark, end)


def test_key_sums_carry_a_key_across_batches_and_compactions():
    import pyarrow as pa

    from airflow_backfill.engine.delta import driver_feed

    sums = driver_feed._KeySums(1)
    batch = 4 * driver_feed._KEY_BATCH_ROWS + 1  # every add compacts what came before
    for start in range(0, 3 * batch, batch):  # keys removed, none gained
        sums.add([pa.array(range(start, start + batch), pa.int64())], pa.array(["delete"] * batch))
    assert sums.kept == 3 * batch and not sums.any_gained()
    sums.add([pa.array([5, 5], pa.int64())], pa.array(["insert", "update_postimage"]))  # +2 on a key at -1
    assert sums.any_gained()
    sums.add([pa.array([5], pa.int64())], pa.array(["update_preimage"]))  # back to 0: dropped
    assert not sums.any_gained() and sums.kept == 3 * batch - 1


def test_the_change_files_key_range_is_the_change_rows_range(spark, tmp_path):
    uri = str(tmp_path / "t")
    _create(spark, uri, deletion_vectors=False)
    spark.sql(f"UPDATE delta.`{uri}` SET s = 'updated' WHERE k IN (3, 11)")
    spark.sql(f"DELETE FROM delta.`{uri}` WHERE k = 16")
    spark.sql(f"INSERT INTO delta.`{uri}` VALUES (100, 1.50, NULL, NULL, NULL, NULL)")  # an append: no change files
    for end in (2, 3):  # version 3 wrote no change files: its appended file's footer bounds its rows
        feed = _spark_feed(spark, uri, 0, end, None)
        for column in ("k", "day"):
            low, high = feed.agg({column: "min"}).first()[0], feed.agg({column: "max"}).first()[0]
            nulls = feed.where(f"{column} IS NULL").count() > 0
            assert change_key_range(uri, 0, end, column) == ChangeKeyRange(low, high, nulls, feed.count())
    assert change_key_range(uri, 0, 2, "no_such_column") is None
    spark.sql(f"UPDATE delta.`{uri}` SET s = 'again' WHERE k = 100")
    assert change_key_range(uri, 3, 4, "at") == ChangeKeyRange(None, None, True, 2)  # only NULLs
