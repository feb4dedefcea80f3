"""A LEFT JOIN's padding term (the parent rows its NULL-supplying table pads or stops
padding in a round) found by the driver equals Spark's: join keys of every type Arrow
groups as Spark does, NULL join values (never matched, never padded back), keys whose
last row leaves (their parents padded again), keys that gain their first row (their
padding retracted), rows that move between keys and updates that keep the key. Held to
`padding_by_spark` over commits written by Spark, with the test process in several time
zones; timestamp and floating-point join keys are left to Spark."""

from __future__ import annotations

import datetime as dt
import random
from decimal import Decimal
from typing import Any

import pytest
from float_bits import exact_rows
from process_zone import python_in_zone

from airflow_backfill.engine.delta.driver_rows import is_local
from airflow_backfill.engine.delta.log import latest_version
from airflow_backfill.engine.joins.delta_rule import netted_changes
from airflow_backfill.engine.joins.padding import padding_by_spark, padding_changes, padding_in_driver
from airflow_backfill.engine.joins.relation import reader
from airflow_backfill.engine.joins.rounds import join_plan
from airflow_backfill.job import BackfillJob

pytestmark = pytest.mark.spark

ZONES = ("America/New_York", "Asia/Kolkata", "UTC")
JOIN_VALUES: dict[str, list[Any]] = {
    "BIGINT": [-(2**63), 0, 7, 2**63 - 1],
    "STRING": ["", "a", "ü", "a "],
    "DECIMAL(20, 4)": [Decimal("-0.0001"), Decimal("0.0000"), Decimal("12345678901234.5678"), Decimal("1")],
    "DATE": [dt.date(1, 1, 1), dt.date(1582, 10, 4), dt.date(2024, 2, 29), dt.date(9999, 12, 31)],
    "TIMESTAMP": [dt.datetime(1883, 11, 18, 12, 0, tzinfo=dt.UTC), dt.datetime(2024, 3, 10, 2, 30, tzinfo=dt.UTC),
                  dt.datetime(2024, 11, 3, 1, 30, tzinfo=dt.UTC), dt.datetime(1970, 1, 1, tzinfo=dt.UTC)],
    "TIMESTAMP_NTZ": [dt.datetime(2024, 3, 10, 2, 30), dt.datetime(2024, 11, 3, 1, 30), dt.datetime(1, 1, 1),
                      dt.datetime(9999, 12, 31, 23, 59, 59, 999999)],
}

LOOKED_UP = ("BIGINT", "STRING", "DECIMAL(20, 4)", "DATE")
"""Join types the driver looks rows up by (`driver_lookup`)."""


def _tables(spark: Any, root: str, join_type: str, rng: random.Random) -> dict[str, str]:
    """A parent `p` (three or more rows at every join value and at NULL, in a shuffled
    order) and a NULL-supplying `s` holding rows at only some of the values."""
    values = JOIN_VALUES[join_type]
    uris = {name: f"{root}/{name}" for name in ("p", "s")}
    joins = [[*values, None][key % (len(values) + 1)] for key in range(16)]
    rng.shuffle(joins)
    parents = [(key, join, f"p{key}") for key, join in enumerate(joins)]
    spark.createDataFrame(parents, f"p_id BIGINT, j {join_type}, x STRING").write.format("delta") \
        .option("delta.enableChangeDataFeed", "true").save(uris["p"])
    supplying = [(key, values[key % 2], key * 10) for key in range(3)] + [(3, None, 30)]
    spark.createDataFrame(supplying, f"s_id BIGINT, j {join_type}, y BIGINT").write.format("delta") \
        .option("delta.enableChangeDataFeed", "true").save(uris["s"])
    return uris


def _commit_round(spark: Any, uri: str, join_type: str) -> None:
    """Commits that make every kind of flip: values[2] and values[3] gain their first rows
    (retract), values[0] loses its last ones (restore), a row moves from values[1] to
    NULL and back, a NULL row is updated, an update keeps its key."""
    values = JOIN_VALUES[join_type]
    _upsert(spark, uri, join_type, [(10, values[2], 100), (11, values[3], 110), (12, values[3], 120)])
    spark.sql(f"DELETE FROM delta.`{uri}` WHERE s_id IN (0, 2)")  # values[0]'s rows
    _upsert(spark, uri, join_type, [(1, None, 10)])
    _upsert(spark, uri, join_type, [(1, values[1], 11)])
    spark.sql(f"UPDATE delta.`{uri}` SET y = y + 1 WHERE s_id IN (3, 11)")


def _upsert(spark: Any, uri: str, join_type: str, rows: list[tuple[Any, ...]]) -> None:
    spark.createDataFrame(rows, f"s_id BIGINT, j {join_type}, y BIGINT").createOrReplaceTempView("incoming")
    spark.sql(f"MERGE INTO delta.`{uri}` t USING incoming s ON t.s_id = s.s_id "
              "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *")


@pytest.mark.parametrize("join_type", list(JOIN_VALUES))
def test_padding_found_by_the_driver_equals_sparks(spark, tmp_path, join_type):
    rng = random.Random(join_type)  # str seeds are stable across processes; hash() is not
    uris = _tables(spark, str(tmp_path), join_type, rng)
    old = latest_version(uris["s"])
    _commit_round(spark, uris["s"], join_type)
    new = latest_version(uris["s"])
    job = BackfillJob(name="padded", target=str(tmp_path / "mv"), sources={
        "p": {"table": uris["p"], "primary_key": ["p_id"]}, "s": {"table": uris["s"], "primary_key": ["s_id"]}},
        query="SELECT p.p_id, p.x, s.s_id, s.y FROM p LEFT JOIN s ON p.j = s.j")
    plan = join_plan(job)
    index = plan.index("s")
    changes = netted_changes(spark, job, plan, index, old, new)
    assert is_local(changes)
    read = reader(spark, job, plan, {"p": latest_version(uris["p"]), "s": old})
    held = padding_in_driver(spark, job, plan, index, changes, read, new)
    if join_type in LOOKED_UP:
        assert held is not None and held.table.num_rows > 0  # the driver took the round
    else:
        assert held is None  # left to Spark: the driver looks up no timestamps (time zones)
    cached: list[Any] = []
    by_spark = padding_by_spark(spark, job, plan, index, changes, read, new, cached)
    in_driver = padding_changes(spark, job, plan, index, changes, read, new, cached)
    assert in_driver is not None
    for zone in ZONES:  # both collected in the zone: collect() gives local wall times
        with python_in_zone(zone):
            expected = exact_rows(by_spark)
            assert exact_rows(in_driver) == expected, zone
    for frame in cached:
        frame.unpersist()
    signs = {row[-1] for row in expected}
    assert signs == {-1, 1}, expected  # both retracted and restored padding, so the comparison means something
    padded = [by_spark.schema.names.index(c) for c in plan.flat_columns(index)]
    assert padded and all(row[i] is None for row in expected for i in padded)  # NULL for every column of s


def test_floating_point_join_keys_are_left_to_spark(spark, tmp_path):
    """Arrow groups floats by their bits (-0.0 apart from 0.0), Spark's join does not."""
    uris = {name: str(tmp_path / name) for name in ("p", "s")}
    spark.createDataFrame([(1, 0.0)], "p_id BIGINT, j DOUBLE").write.format("delta") \
        .option("delta.enableChangeDataFeed", "true").save(uris["p"])
    spark.createDataFrame([(1, 1.5)], "s_id BIGINT, j DOUBLE").write.format("delta") \
        .option("delta.enableChangeDataFeed", "true").save(uris["s"])
    old = latest_version(uris["s"])
    spark.sql(f"INSERT INTO delta.`{uris['s']}` VALUES (2, CAST('-0.0' AS DOUBLE))")
    job = BackfillJob(name="padded", target=str(tmp_path / "mv"), sources={
        "p": {"table": uris["p"], "primary_key": ["p_id"]}, "s": {"table": uris["s"], "primary_key": ["s_id"]}},
        query="SELECT p.p_id, s.s_id FROM p LEFT JOIN s ON p.j = s.j")
    plan = join_plan(job)
    index = plan.index("s")
    changes = netted_changes(spark, job, plan, index, old, old + 1)
    read = reader(spark, job, plan, {"p": latest_version(uris["p"]), "s": old})
    assert padding_in_driver(spark, job, plan, index, changes, read, old + 1) is None
    cached: list[Any] = []
    rows = padding_changes(spark, job, plan, index, changes, read, old + 1, cached)
    assert rows is not None and [tuple(row) for row in rows.collect()] == [(1, 0.0, None, None, -1)]  # 0.0 meets -0.0
    for frame in cached:
        frame.unpersist()
