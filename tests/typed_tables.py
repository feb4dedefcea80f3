"""Upstreams of every column type Delta stores, with the values engines disagree on.

`typed` holds a boolean, every integer width, float and double (NaN, infinities, -0.0,
extremes), decimals up to (38, 18), strings (empty, unicode, 300 characters, quotes, a NUL),
binary, dates and timestamps before 1900 and at daylight-saving changes (instants in
New York and wall times that do not exist or exist twice there), timestamp_ntz, an
array, a struct holding a timestamp and a decimal, an array of timestamps and a map;
NULLs everywhere but the key. `dims` is a small table `typed` joins on `bid`.

Rows are built as Arrow (instants as UTC-aware values, wall times as naive ones) and
written by Spark, so that no value passes through the local time zone of any process.
Changes are Spark MERGE, UPDATE and DELETE commits on tables with the change data feed
and deletion vectors on, as users' writers make them.
"""

from __future__ import annotations

import datetime as dt
import random
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

UTC = dt.UTC

TYPED_DDL = (
    "id BIGINT NOT NULL, bid BIGINT, grp STRING, flag BOOLEAN, b TINYINT, sm SMALLINT, i INT, l BIGINT, "
    "f FLOAT, d DOUBLE, dec DECIMAL(38,18), money DECIMAL(10,2), s STRING, bin BINARY, day DATE, "
    "ts TIMESTAMP, ntz TIMESTAMP_NTZ, arr ARRAY<INT>, st STRUCT<x: INT, t: TIMESTAMP, m: DECIMAL(10,2)>, "
    "stamps ARRAY<TIMESTAMP>, mp MAP<STRING, INT>"
)
DIMS_DDL = "bid BIGINT NOT NULL, label STRING, since TIMESTAMP, weight DECIMAL(10,2), ratio DOUBLE"

INSTANTS = [
    dt.datetime(1850, 1, 1, 12, 0, tzinfo=UTC),  # local mean time in New York (-4:56:02)
    dt.datetime(1883, 11, 18, 16, 59, 59, 999999, tzinfo=UTC),  # a minute before New York's standard time
    dt.datetime(1945, 1, 1, 0, 0, tzinfo=UTC),  # Kolkata's war time (+6:30)
    dt.datetime(1970, 1, 1, tzinfo=UTC),
    dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    dt.datetime(2024, 3, 10, 6, 59, 59, 999999, tzinfo=UTC),  # New York springs forward at 07:00 UTC
    dt.datetime(2024, 3, 10, 7, 0, tzinfo=UTC),
    dt.datetime(2024, 11, 3, 5, 30, tzinfo=UTC),  # 01:30 in New York, the first time
    dt.datetime(2024, 11, 3, 6, 30, tzinfo=UTC),  # 01:30 in New York, the second time
    dt.datetime(2026, 12, 1, 16, 4, 41, 123456, tzinfo=UTC),
    dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
]
WALL_TIMES = [
    dt.datetime(2024, 3, 10, 2, 30),  # does not exist in New York
    dt.datetime(2024, 11, 3, 1, 30),  # exists twice in New York
    dt.datetime(1850, 1, 1, 0, 0),
    dt.datetime(1970, 1, 1, 0, 0),
    dt.datetime(2026, 12, 1, 23, 59, 59, 999999),
    dt.datetime(9999, 12, 31, 23, 59, 59, 999999),
]
DATES = [dt.date(1850, 6, 1), dt.date(1899, 12, 31), dt.date(1970, 1, 1), dt.date(2024, 3, 10),
         dt.date(2024, 2, 29), dt.date(9999, 12, 31)]
FLOATS = [float("nan"), float("inf"), float("-inf"), -0.0, 0.0, 3.4028234663852886e38, 1.401298464324817e-45, 1.5]
DOUBLES = [float("nan"), float("inf"), float("-inf"), -0.0, 0.0, 1.7976931348623157e308, 5e-324, 0.1, -2.5]
BIG_DECIMALS = [Decimal("99999999999999999999.999999999999999999"), Decimal("-99999999999999999999.999999999999999999"),
                Decimal("0.000000000000000001"), Decimal(0), Decimal("123.456")]
MONEY = [Decimal("99999999.99"), Decimal("-99999999.99"), Decimal("0.01"), Decimal("0.00"), Decimal("12.34")]
STRINGS = ["", "ü∂ 中文 🚀", "x" * 300, "quote's \"double\" back\\slash", "nul\x00in", "plain", "Zebra", "apple"]
BINARIES = [b"", bytes(range(256)), b"\x00", b"abc"]
GROUPS = ["north", "south", "ü", None]
LABELS = ["gold", "silver", "", None]
INT_EDGES = {"b": (-128, 127), "sm": (-32768, 32767), "i": (-2**31, 2**31 - 1), "l": (-2**63, 2**63 - 1)}


def typed_schema() -> pa.Schema:
    struct = pa.struct([pa.field("x", pa.int32()), pa.field("t", pa.timestamp("us", tz="UTC")),
                        pa.field("m", pa.decimal128(10, 2))])
    return pa.schema([
        pa.field("id", pa.int64(), nullable=False), pa.field("bid", pa.int64()), pa.field("grp", pa.string()),
        pa.field("flag", pa.bool_()), pa.field("b", pa.int8()), pa.field("sm", pa.int16()),
        pa.field("i", pa.int32()), pa.field("l", pa.int64()), pa.field("f", pa.float32()),
        pa.field("d", pa.float64()), pa.field("dec", pa.decimal128(38, 18)), pa.field("money", pa.decimal128(10, 2)),
        pa.field("s", pa.string()), pa.field("bin", pa.binary()), pa.field("day", pa.date32()),
        pa.field("ts", pa.timestamp("us", tz="UTC")), pa.field("ntz", pa.timestamp("us")),
        pa.field("arr", pa.list_(pa.int32())), pa.field("st", struct),
        pa.field("stamps", pa.list_(pa.timestamp("us", tz="UTC"))), pa.field("mp", pa.map_(pa.string(), pa.int32())),
    ])


def dims_schema() -> pa.Schema:
    return pa.schema([pa.field("bid", pa.int64(), nullable=False), pa.field("label", pa.string()),
                      pa.field("since", pa.timestamp("us", tz="UTC")), pa.field("weight", pa.decimal128(10, 2)),
                      pa.field("ratio", pa.float64())])


class TypedRows:
    """A seeded source of `typed` and `dims` rows: every column drawn from its edge values,
    NULL about one time in six (never the key)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def _maybe(self, value: Any) -> Any:
        return None if self.rng.random() < 1 / 6 else value

    def typed(self, row_id: int) -> dict[str, Any]:
        pick, maybe = self.rng.choice, self._maybe
        low, high = INT_EDGES["i"]
        return {
            "id": row_id, "bid": maybe(self.rng.randrange(6)), "grp": pick(GROUPS), "flag": maybe(pick([True, False])),
            **{name: maybe(pick([lo, hi, 0, self.rng.randint(-100, 100)])) for name, (lo, hi) in INT_EDGES.items()},
            "f": maybe(pick(FLOATS)), "d": maybe(pick(DOUBLES)), "dec": maybe(pick(BIG_DECIMALS)),
            "money": maybe(pick(MONEY)), "s": maybe(pick(STRINGS)), "bin": maybe(pick(BINARIES)),
            "day": maybe(pick(DATES)), "ts": maybe(pick(INSTANTS)), "ntz": maybe(pick(WALL_TIMES)),
            "arr": maybe(pick([[], [1, None, low], [high, 0]])),
            "st": maybe({"x": maybe(self.rng.randint(-5, 5)), "t": maybe(pick(INSTANTS)), "m": maybe(pick(MONEY))}),
            "stamps": maybe([maybe(pick(INSTANTS)) for _ in range(self.rng.randint(0, 2))]),
            "mp": maybe(pick([[], [("a", 1), ("b", None)], [("ü", -1)]])),
        }

    def dims(self, bid: int) -> dict[str, Any]:
        return {"bid": bid, "label": self.rng.choice(LABELS), "since": self._maybe(self.rng.choice(INSTANTS)),
                "weight": self._maybe(self.rng.choice(MONEY)), "ratio": self._maybe(self.rng.choice(DOUBLES))}


def arrow_rows(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=schema)


def write_new_table(spark: SparkSession, uri: str, rows: pa.Table, ddl: str) -> None:
    """Create a Delta table at `uri` of `rows` with the change data feed and deletion
    vectors on (a Spark write of an Arrow local relation: no local times involved)."""
    frame = spark.createDataFrame(rows, schema=ddl)
    (frame.write.format("delta").option("delta.enableChangeDataFeed", "true")
     .option("delta.enableDeletionVectors", "true").save(uri))


def merge_rows(spark: SparkSession, uri: str, upserts: pa.Table, ddl: str, key: str,
               deletes: list[int] = ()) -> None:  # type: ignore[assignment]
    """One MERGE commit: rows of `upserts` replace or join the table's rows of their key,
    and the rows of `deletes` leave (pre/post images and deletes in the feed)."""
    frame = spark.createDataFrame(upserts, schema=ddl)
    if deletes:
        from pyspark.sql import functions as F

        gone = spark.createDataFrame([(k,) for k in deletes], f"{key} BIGINT")
        filler = [F.lit(None).cast(field.dataType).alias(field.name) for field in frame.schema.fields if field.name != key]
        frame = frame.withColumn("__gone", F.lit(False)).unionByName(
            gone.select(F.col(key), *filler, F.lit(True).alias("__gone")))
    else:
        from pyspark.sql import functions as F

        frame = frame.withColumn("__gone", F.lit(False))
    frame.createOrReplaceTempView("__changes")
    spark.sql(f"""
        MERGE INTO delta.`{uri}` AS t USING __changes AS c ON t.{key} = c.{key}
        WHEN MATCHED AND c.__gone THEN DELETE
        WHEN MATCHED THEN UPDATE SET *
        WHEN NOT MATCHED AND NOT c.__gone THEN INSERT *
    """)


def run_sql(spark: SparkSession, statement: str) -> None:
    spark.sql(statement)
