"""A join round nets each upstream's change rows per whole row; a small feed is netted by
Arrow in the driver, any other by Spark (`exact_values.grouped_rows`). Both must give
the same rows, bit for bit: floats keep the sign of their zero (-0.0 is not 0.0 in an MV
row), every NaN is one value, NULL is its own value, and a row that left and came back
nets to nothing. Held to Spark's netting over generated commits of every flat type,
with the test process in several time zones."""

from __future__ import annotations

import random
import struct
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from float_bits import exact_rows, float_bits
from process_zone import python_in_zone

from airflow_backfill.engine.delta.driver_rows import is_local
from airflow_backfill.engine.delta.log import latest_version
from airflow_backfill.engine.joins.delta_rule import netted_changes
from airflow_backfill.engine.joins.rounds import join_plan
from airflow_backfill.engine.sizes import overridden
from airflow_backfill.job import BackfillJob

pytestmark = pytest.mark.spark

NAN_WITH_PAYLOAD = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000001))[0]
ZONES = ("America/New_York", "Asia/Kolkata", "UTC")
DOUBLES = [0.0, -0.0, float("nan"), NAN_WITH_PAYLOAD, float("inf"), float("-inf"), 5e-324, 1.5, None]
FLOATS = [0.0, -0.0, float("nan"), float("inf"), 1.5, None]
ARROW = pa.schema([("k", pa.int64()), ("d", pa.float64()), ("f", pa.float32()), ("s", pa.string()),
                   ("ts", pa.timestamp("us", tz="UTC")), ("ntz", pa.timestamp("us")), ("day", pa.date32()),
                   ("dec", pa.decimal128(20, 4))])
DDL = "k BIGINT, d DOUBLE, f FLOAT, s STRING, ts TIMESTAMP, ntz TIMESTAMP_NTZ, day DATE, dec DECIMAL(20, 4)"


def _row(rng: random.Random, key: int) -> tuple[Any, ...]:
    import datetime as dt

    return (key, rng.choice(DOUBLES), rng.choice(FLOATS), rng.choice(["a", "ü", "", None]),
            rng.choice([dt.datetime(2024, 3, 10, 2, 30, tzinfo=dt.UTC), dt.datetime(1883, 11, 18, 12, 0,
                                                                                             tzinfo=dt.UTC), None]),
            rng.choice([dt.datetime(2024, 11, 3, 1, 30), None]), rng.choice([dt.date(1, 1, 1), dt.date(2024, 2, 29), None]),
            rng.choice([Decimal("-0.0001"), Decimal("12345678901234.5678"), None]))


def _upsert(spark: Any, uri: str, rows: list[tuple[Any, ...]]) -> None:
    spark.createDataFrame(rows, DDL).createOrReplaceTempView("incoming")
    spark.sql(f"MERGE INTO delta.`{uri}` t USING incoming s ON t.k = s.k "
              "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *")


def _commit_changes(spark: Any, uri: str, rng: random.Random) -> None:
    """Commits whose feed holds every kind of change: inserts, an update from 0.0 to -0.0
    (it must not net away), one from a NaN to another NaN and updates that keep the row
    (they must), deletes, rows deleted then inserted again the same, and a row whose
    NaN arrives with a payload and leaves as Spark's NaN (the same row)."""
    spark.sql(f"UPDATE delta.`{uri}` SET d = CAST('-0.0' AS DOUBLE) WHERE d = 0.0")  # = takes -0.0 for 0.0
    spark.sql(f"UPDATE delta.`{uri}` SET d = CAST('NaN' AS DOUBLE) WHERE isnan(d)")
    spark.sql(f"UPDATE delta.`{uri}` SET s = s WHERE k % 3 = 0")
    kept = [tuple(row) for row in spark.sql(f"SELECT * FROM delta.`{uri}` WHERE k IN (4, 5)").collect()]
    spark.sql(f"DELETE FROM delta.`{uri}` WHERE k IN (4, 5, 6)")
    _upsert(spark, uri, kept + [_row(rng, key) for key in range(12, 16)])
    arriving = _row(rng, 20)
    _append_as_is(uri, [(20, NAN_WITH_PAYLOAD, *arriving[2:])])
    spark.sql(f"DELETE FROM delta.`{uri}` WHERE k = 20")  # Spark writes the leaving image with its own NaN


def _append_as_is(uri: str, rows: list[tuple[Any, ...]]) -> None:
    """Rows appended by delta-rs, their floats' bits as given (Spark's writes make every
    NaN the one NaN)."""
    write_deltalake(uri, pa.Table.from_pylist([dict(zip(ARROW.names, row, strict=True)) for row in rows],
                                              schema=ARROW), mode="append")


def test_rows_netted_by_arrow_equal_sparks_netting_in_every_zone(spark, tmp_path):
    uris = {name: str(tmp_path / name) for name in ("a", "b")}
    for uri in uris.values():
        spark.createDataFrame([], DDL).write.format("delta").option("delta.enableChangeDataFeed", "true").save(uri)
    rng = random.Random(11)
    _upsert(spark, uris["b"], [_row(rng, key) for key in range(0, 8)])
    first = [_row(rng, key) for key in range(0, 12)]
    first[1] = (1, 0.0, *first[1][2:])
    first[2] = (2, NAN_WITH_PAYLOAD, *first[2][2:])
    _upsert(spark, uris["a"], first)
    old = latest_version(uris["a"])
    _commit_changes(spark, uris["a"], rng)
    new = latest_version(uris["a"])
    job = BackfillJob(name="netted", target=str(tmp_path / "mv"), sources={
        name: {"table": uri, "primary_key": ["k"]} for name, uri in uris.items()},
        query="SELECT a.k, a.d, a.f, a.s, a.ts, a.ntz, a.day, a.dec, b.d AS bd FROM a JOIN b ON a.k = b.k")
    plan = join_plan(job)
    index = plan.index("a")
    with overridden(join_feed_rows=0):
        by_spark = netted_changes(spark, job, plan, index, old, new)
    for zone in ZONES:  # both collected in the zone: collect() gives local wall times
        with python_in_zone(zone):
            in_driver = netted_changes(spark, job, plan, index, old, new)
            assert is_local(in_driver) and not is_local(by_spark)  # each side took the path it stands for
            assert in_driver.schema == by_spark.schema
            netted = exact_rows(by_spark)
            assert exact_rows(in_driver) == netted, zone
    by_spark.unpersist()
    zero, negative_zero = float_bits(0.0), float_bits(-0.0)
    assert (1, zero, -1) in {(row[0], row[1], row[-1]) for row in netted}  # the sign of zero changed the row
    assert (1, negative_zero, 1) in {(row[0], row[1], row[-1]) for row in netted}
    assert 2 not in {row[0] for row in netted}  # a NaN for a NaN: the same row
    assert {4, 5, 20}.isdisjoint(row[0] for row in netted)  # left and came back, or came and left
