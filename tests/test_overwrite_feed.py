"""An overwrite the driver writes keeps the change feed Delta's own MERGE writes for the same
changes: each changed key's old row and new row (update pre- and post-images, deletes,
inserts), not every row of the table. Held to Spark: the same changes merged by Delta into
a twin table, both feeds read by Spark's change-feed reader, and the engine's own reader
reading the overwrite's; over every column type the driver writes, edge values, NULL keys
and values, with this process's Python in several time zones."""

from __future__ import annotations

import datetime
import json
import math
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest
from process_zone import python_in_zone
from spark_oracle import canonical
from test_keyed_writes import changes, create, rows_of, write_as

from airflow_backfill.engine.delta.change_feed import COMMIT_VERSION
from airflow_backfill.engine.delta.driver_feed import feed_in_driver
from airflow_backfill.engine.delta.driver_rows import held_in_driver
from airflow_backfill.engine.delta.overwrite_feed import overwrite_change_rows
from airflow_backfill.engine.planning.round_plan import MERGE, OVERWRITE

pytestmark = pytest.mark.spark

SCHEMA = ("k int, s string, d date, ts timestamp, ntz timestamp_ntz, dec decimal(12,3), x double, b boolean, "
          "n long")
OLD_WORLD = datetime.datetime(1850, 3, 1, 12, 0, 0, 1)  # before railway time: local mean time in New York
SPRING_GAP = datetime.datetime(2024, 3, 10, 2, 30)  # a local time New York skips


def row(k: int | None, variant: int) -> tuple:
    return (k, ["", "ä ü", None, "x" * 40][variant % 4], datetime.date(1, 1, 1) + datetime.timedelta(days=variant * 97),
            [OLD_WORLD, SPRING_GAP, None, datetime.datetime(2038, 1, 19, 3, 14, 8)][variant % 4],
            [SPRING_GAP, OLD_WORLD, datetime.datetime(1970, 1, 1), None][variant % 4],
            [Decimal("-999999999.999"), Decimal("0.001"), None, Decimal(variant)][variant % 4],
            [-0.0, math.inf, float("nan"), None][variant % 4], [True, False, None, True][variant % 4],
            [-(2 ** 63), 2 ** 63 - 1, None, variant][variant % 4])


TABLE = [row(k, k) for k in range(1, 13)] + [row(None, 13)]
CHANGES = [(*row(2, 20), True), (*row(None, 21), True), (*row(3, 3), None), (*row(7, 7), None),
           (*row(99, 0), None), (*row(20, 22), True), (*row(21, 23), True)]
"""Updates of key 2 and of the NULL key, deletes of keys 3 and 7 (and of 99, which the
table does not hold), inserts of keys 20 and 21."""
EXPECTED_TYPES = {"update_preimage": 2, "update_postimage": 2, "delete": 2, "insert": 2}


def spark_feed(spark, uri: str, version: int) -> list[str]:
    """The version's change rows as Spark's reader gives them: each row and its change type."""
    feed = (spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", version)
            .option("endingVersion", version).load(uri))
    return sorted(row["__row"] for row in canonical(feed.drop(COMMIT_VERSION, "_commit_timestamp")).collect())


@pytest.mark.parametrize("zone", ["UTC", "America/New_York", "Asia/Kolkata"])
def test_an_overwrite_by_the_driver_feeds_what_a_merge_feeds(spark, tmp_path: Path, zone: str) -> None:
    feeds = {}
    for way in (OVERWRITE, MERGE):
        uri = str(tmp_path / way)
        create(spark, uri, TABLE, SCHEMA)
        held = held_in_driver(changes(spark, CHANGES, SCHEMA))  # as a round's few changes are
        with python_in_zone(zone):
            assert write_as(spark, way, uri, held, version=1, null_safe=True) == len(CHANGES)
        feeds[way] = spark_feed(spark, uri, 1)
    overwritten = str(tmp_path / OVERWRITE)
    log_entry = [json.loads(line) for line in Path(overwritten, "_delta_log", f"{1:020}.json").read_text().splitlines()]
    assert [action["cdc"]["dataChange"] for action in log_entry if "cdc" in action] == [False]
    assert any("remove" in action for action in log_entry)  # the whole table was rewritten...
    assert feeds[OVERWRITE] == feeds[MERGE]  # ...and its feed holds only the changed keys' rows
    types = [json.loads(text)["_change_type"] for text in feeds[OVERWRITE]]
    assert {kind: types.count(kind) for kind in set(types)} == EXPECTED_TYPES
    assert repr(rows_of(spark, overwritten)) == repr(rows_of(spark, str(tmp_path / MERGE)))  # NaN equals itself

    held_feed = feed_in_driver(spark, overwritten, 0, 1)  # the engine reads the change file alone
    assert held_feed is not None and held_feed.rows == sum(EXPECTED_TYPES.values())
    engine = sorted(row["__row"] for row in canonical(held_feed.frame.drop(COMMIT_VERSION)).collect())
    assert engine == feeds[OVERWRITE]


def test_change_rows_pair_a_key_held_before_and_after_as_an_update() -> None:
    leaving = pa.table({"k": pa.array([1, None, 3], pa.int32()), "v": ["a", "n", "c"]})
    arriving = pa.table({"k": pa.array([None, 4, 1], pa.int32()), "v": ["N", "d", "A"]})
    rows = overwrite_change_rows(leaving, arriving, ["k"]).to_pylist()
    assert rows == [
        {"k": 1, "v": "a", "_change_type": "update_preimage"},
        {"k": None, "v": "n", "_change_type": "update_preimage"},  # NULL keys pair as `<=>` pairs them
        {"k": 3, "v": "c", "_change_type": "delete"},
        {"k": None, "v": "N", "_change_type": "update_postimage"},
        {"k": 4, "v": "d", "_change_type": "insert"},
        {"k": 1, "v": "A", "_change_type": "update_postimage"},
    ]


def test_a_table_whose_feed_nobody_reads_gets_no_change_file(spark, tmp_path: Path) -> None:
    """An aggregate's state is overwritten with `fed=False`: the same rows, no change file."""
    from airflow_backfill.engine.rounds.write import prepare, write

    uri = str(tmp_path / "state")
    create(spark, uri, TABLE, SCHEMA)
    prepared = prepare(spark, uri, held_in_driver(changes(spark, CHANGES, SCHEMA)), ("k",), null_safe=True)
    try:
        assert write(spark, prepared, OVERWRITE, app_id="airflow_backfill/test", version=1, user_metadata="{}",
                     fed=False) == len(CHANGES)
    finally:
        prepared.release()
    log_entry = Path(uri, "_delta_log", f"{1:020}.json").read_text()
    assert '"add"' in log_entry and '"cdc"' not in log_entry
    assert not Path(uri, "_change_data").exists()
