"""The key facts a stateless round's checks take from the driver's Arrow rows (the range of
the keys that arrived, and the bounds of those that may meet a table row) equal what
Spark's job over the same rows gives: over generated rows of every key type (the
boundable integers and dates, and types that get no bounds), NULL keys and flags, each
type's edge values, and table maxima below, inside and above the keys; with the process
and Spark's session in several time zones."""

from __future__ import annotations

import datetime
import random

import pytest
from process_zone import python_in_zone
from spark_job_count import jobs_started

from airflow_backfill.engine.delta.commits import ARRIVED, PRESENT
from airflow_backfill.engine.delta.driver_rows import is_local, local_relation
from airflow_backfill.engine.delta.key_range import changes_key_range
from airflow_backfill.engine.rounds.write import arrived_key_bounds
from airflow_backfill.engine.spark_session import TIME_ZONE

pytestmark = pytest.mark.spark

EPOCH = datetime.date(1970, 1, 1)
KEY_TYPES = {
    "tinyint": (-128, 127),
    "smallint": (-32768, 32767),
    "int": (-2**31, 2**31 - 1),
    "bigint": (-2**63, 2**63 - 1),
    "date": (datetime.date(1, 1, 1), datetime.date(9999, 12, 31)),
    "string": ("", "\uffff"),
    "timestamp": (datetime.datetime(1, 1, 2, tzinfo=datetime.UTC),
                  datetime.datetime(9999, 12, 30, tzinfo=datetime.UTC)),
}
"""Key types and their edge values (strings and timestamps are never bounded)."""


def key_value(kind: str, rng: random.Random):
    low, high = KEY_TYPES[kind]
    pick = rng.random()
    if pick < 0.1:
        return None
    if pick < 0.2:
        return rng.choice((low, high))
    if kind == "date":
        return EPOCH + datetime.timedelta(days=rng.randint(-400, 400))
    if kind == "string":
        return rng.choice(("a", "b", "é", "Z", "k7"))
    if kind == "timestamp":
        return datetime.datetime(2020, 3, 8, tzinfo=datetime.UTC) + datetime.timedelta(hours=rng.randint(-30, 30))
    return rng.randint(-50, 50)


def frames(spark, kind: str, rows: list[tuple]):
    """The same rows twice: cached by Spark, and as a local relation the driver holds (made
    from the Arrow rows Spark gives for them)."""
    cached = spark.createDataFrame(rows, f"k {kind}, v string, {PRESENT} boolean, {ARRIVED} boolean").cache()
    local = local_relation(spark, cached.toArrow(), cached.schema)
    assert local is not None and is_local(local) and not is_local(cached)
    return local, cached


def generated_rows(kind: str, rng: random.Random, count: int) -> list[tuple]:
    flags = (True, False, None)
    return [(key_value(kind, rng), f"v{index}", rng.choice((True, None)), rng.choice(flags))
            for index in range(count)]


def table_maxima(kind: str, rows: list[tuple]) -> list:
    """None (unknown), and maxima below, among and above the generated keys."""
    keys = sorted(row[0] for row in rows if row[0] is not None)
    if kind in ("string", "timestamp") or not keys:
        return [None]
    return [None, keys[0], keys[len(keys) // 2], keys[-1]]


ZONES = ("UTC", "America/New_York", "Asia/Kolkata")


@pytest.mark.parametrize("kind", sorted(KEY_TYPES))
def test_the_drivers_key_facts_equal_a_spark_job_over_the_same_rows(spark, kind):
    rng = random.Random(kind)
    cases = [generated_rows(kind, rng, count) for count in (0, 30)]
    cases.append([(None, "null", True, True), (None, "gone", None, True)])  # only NULL keys arrive
    for rows in cases:
        local, cached = frames(spark, kind, rows)
        leading = local.schema["k"]
        maxima = table_maxima(kind, rows)
        try:
            expected = (changes_key_range(cached, "k", ARRIVED, only=ARRIVED),
                        [arrived_key_bounds(cached, leading, top) for top in maxima])
            for zone in ZONES:
                spark.conf.set("spark.sql.session.timeZone", zone)
                with python_in_zone(zone), jobs_started(spark) as jobs:
                    held = (changes_key_range(local, "k", ARRIVED, only=ARRIVED),
                            [arrived_key_bounds(local, leading, top) for top in maxima])
                    assert jobs() == 0
                assert held == expected, (zone, rows)
        finally:
            spark.conf.set("spark.sql.session.timeZone", TIME_ZONE)
            cached.unpersist()
