"""Arrow rows become a DataFrame by `internals.arrow_as_frame`, the engine's lean copy of
PySpark's `createDataFrame(table, schema=schema)` (five JVM calls instead of 44): held to
PySpark's own method over generated rows of every column type Delta stores (NULLs, NaN,
infinities, -0.0, decimal extremes, timestamps before 1900 and at daylight-saving
changes, maps, structs and arrays of timestamps), also as Arrow types other than Spark's
(large strings and binaries, instants without their zone), with the session's time zone and its
large-variable-types setting changed and this process in several time zones. Both frames
are compared row for row as Spark's own text of each row (tests/spark_oracle.py). Rows
with an empty chunk between others (after which PySpark's method drops every row) all
reach the frame, and rows an Arrow filter kept none of (columns of no chunks, which
PySpark's method refuses) make an empty frame."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest
import typed_tables as typed
from process_zone import python_in_zone
from spark_oracle import canonical

from airflow_backfill.engine import internals

pytestmark = pytest.mark.spark

ZONES = ("America/New_York", "Asia/Kolkata", "UTC")


def _rows(seed: int, count: int = 60) -> pa.Table:
    generated = typed.TypedRows(seed)
    return typed.arrow_rows([generated.typed(key) for key in range(count)], typed.typed_schema())


def _as_other_arrow_types(table: pa.Table) -> pa.Table:
    """The same values as Arrow types Spark does not read as they are: large strings and
    binaries, and the instants' column without its zone (UTC wall times, which PySpark
    reads as wall times of the session's zone)."""
    columns = {name: table.column(name) for name in table.column_names}
    columns["s"] = columns["s"].cast(pa.large_string())
    columns["bin"] = columns["bin"].cast(pa.large_binary())
    columns["ts"] = columns["ts"].cast(pa.timestamp("us"))
    return pa.table(columns)


def _text_rows(frame: Any) -> list[str]:
    return sorted(row[0] for row in canonical(frame).collect())


def _calls_while(spark: Any, action: Any) -> tuple[Any, int]:
    """`action()` and how many commands it sent the JVM (but for the releases of JVM
    objects Python no longer holds, which py4j sends when Python's collector runs)."""
    from py4j.clientserver import ClientServerConnection

    sent = ClientServerConnection.send_command
    count = [0]

    def counted(self: Any, command: str) -> Any:
        count[0] += not command.startswith("m\nd\n")
        return sent(self, command)

    ClientServerConnection.send_command = counted  # type: ignore[method-assign]
    try:
        return action(), count[0]
    finally:
        ClientServerConnection.send_command = sent  # type: ignore[method-assign]


@pytest.mark.parametrize("zone", ZONES)
def test_arrow_rows_make_the_frame_pysparks_method_makes(spark, zone):
    from pyspark.sql.types import StructType

    schema = StructType.fromDDL(typed.TYPED_DDL)
    seed = random.Random(zone).randrange(1 << 30)
    tables = {"spark's arrow types": _rows(seed), "other arrow types": _as_other_arrow_types(_rows(seed + 1)),
              "no rows": _rows(seed).slice(0, 0)}
    session_zone = spark.conf.get("spark.sql.session.timeZone")
    large = spark.conf.get("spark.sql.execution.arrow.useLargeVarTypes")
    try:
        with python_in_zone(zone):
            for session_settings in ((zone, "false"), ("UTC", "true")):
                spark.conf.set("spark.sql.session.timeZone", session_settings[0])
                spark.conf.set("spark.sql.execution.arrow.useLargeVarTypes", session_settings[1])
                for name, table in tables.items():
                    expected, pyspark_calls = _calls_while(
                        spark, lambda t=table: spark.createDataFrame(t, schema=schema))
                    made, calls = _calls_while(spark, lambda t=table: internals.arrow_as_frame(spark, t, schema))
                    where = f"{name}, process in {zone}, session {session_settings}"
                    print(where, calls, pyspark_calls)
                    assert calls * 3 < pyspark_calls, (where, calls, pyspark_calls)
                    assert made.schema == expected.schema == schema, where
                    assert internals.plan_kind(internals.analyzed_plan(made)) == "LocalRelation", where
                    assert made.count() == table.num_rows, where
                    assert _text_rows(made) == _text_rows(expected), where
    finally:
        spark.conf.set("spark.sql.session.timeZone", session_zone)
        spark.conf.set("spark.sql.execution.arrow.useLargeVarTypes", large)


def test_empty_chunks_lose_no_row_and_no_chunks_make_an_empty_frame(spark):
    from pyspark.sql.types import StructType

    schema = StructType.fromDDL(typed.TYPED_DDL)
    table = _rows(7)
    none_kept = table.filter(pa.array([False] * table.num_rows))  # columns of no chunks
    assert not any(column.num_chunks for column in none_kept.columns)
    made = internals.arrow_as_frame(spark, none_kept, schema)
    assert made.schema == schema and made.count() == 0
    generated = typed.TypedRows(8)
    rows = [generated.typed(key) for key in range(20)]
    parts = [typed.arrow_rows(part, typed.typed_schema()) for part in (rows[:5], [], rows[5:])]
    pieces, table = pa.concat_tables(parts), typed.arrow_rows(rows, typed.typed_schema())
    assert [len(chunk) for chunk in pieces.column("id").chunks] == [5, 0, 15]  # an empty chunk between
    made = internals.arrow_as_frame(spark, pieces, schema)
    assert _text_rows(made) == _text_rows(internals.arrow_as_frame(spark, table, schema))
    assert made.count() == table.num_rows
