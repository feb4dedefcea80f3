"""The driver's lookup of a table's live rows by key equals Spark's own filter of the
table, for keys of several types and columns, NULL-safe or not, over files that carry
deletion vectors; and it reads only the files their statistics leave room for."""

from __future__ import annotations

import datetime
import random
from decimal import Decimal

import pyarrow as pa
import pytest

from airflow_backfill.engine.delta.keyed_rows import FILE, POSITION, find_rows
from airflow_backfill.engine.delta.log_state import table_state
from airflow_backfill.storage import files

pytestmark = pytest.mark.spark

SCHEMA = "k BIGINT, s STRING, d DATE, m DECIMAL(12,2), v DOUBLE"
KEYS = {"integer": ["k"], "string": ["s"], "date and decimal": ["d", "m"]}


def _row(i: int) -> tuple:
    return (i if i % 17 else None, f"s{i:05d}" if i % 19 else None, datetime.date(2000, 1, 1) + datetime.timedelta(i % 50),
            Decimal(i % 40) / 4 if i % 23 else None, i / 3)


@pytest.fixture(scope="module")
def table(spark, tmp_path_factory) -> str:
    """Four files, in ranges of `k` apart, some rows deleted by vectors and some updated."""
    uri = str(tmp_path_factory.mktemp("keyed") / "t")
    for start in range(0, 400, 100):
        (spark.createDataFrame([_row(i) for i in range(start, start + 100)], SCHEMA).coalesce(1).write
         .format("delta").mode("append").option("delta.enableDeletionVectors", "true").save(uri))
    spark.sql(f"DELETE FROM delta.`{uri}` WHERE k % 5 = 0")
    spark.sql(f"UPDATE delta.`{uri}` SET v = -1 WHERE k % 7 = 0")
    return uri


def _spark_rows(spark, uri: str, columns: list[str], keys: list[tuple], null_safe: bool) -> list[tuple]:
    table = spark.read.format("delta").load(uri)
    wanted = spark.createDataFrame(keys, ", ".join(f"{c} {dict(f.split() for f in SCHEMA.split(', '))[c]}"
                                                   for c in columns))
    condition = [table[c].eqNullSafe(wanted[c]) if null_safe else table[c] == wanted[c] for c in columns]
    return sorted((tuple(r) for r in table.join(wanted, condition, "left_semi").select("k", "s", "d", "m", "v")
                   .collect()), key=_order) if keys else []


def _order(row: tuple) -> tuple:
    return tuple((value is not None, value) for value in row)


@pytest.mark.parametrize("null_safe", [False, True])
@pytest.mark.parametrize("kind", sorted(KEYS))
def test_the_rows_found_are_sparks(spark, table, kind, null_safe):
    columns = KEYS[kind]
    rng = random.Random(len(kind) + null_safe)
    every = spark.read.format("delta").load(table).select(*columns).distinct().collect()
    keys = [tuple(r) for r in rng.sample(every, 25)] + [tuple([None] * len(columns))]
    if kind == "integer":
        keys += [(1000,), (5,)]  # beyond every file; deleted
    arrow_keys = spark.createDataFrame(keys, ", ".join(f"{c} {dict(f.split() for f in SCHEMA.split(', '))[c]}"
                                                       for c in columns)).toArrow()
    found = find_rows(table_state(table), columns, arrow_keys, ["k", "s", "d", "m", "v"], null_safe=null_safe)
    assert found is not None
    rows = sorted((tuple(r.values()) for r in found.rows.select(["k", "s", "d", "m", "v"]).to_pylist()), key=_order)
    assert rows == _spark_rows(spark, table, columns, keys, null_safe)
    for row in found.rows.to_pylist():  # each row sits where the lookup says
        file = found.files[row[FILE]]
        stored = files.read_parquet_columns(file.uri, ["k", "v"]).slice(row[POSITION], 1).to_pylist()[0]
        assert stored["k"] == row["k"]


def test_only_the_files_the_keys_can_be_in_are_read(spark, table, monkeypatch):
    opened = []
    real = files.parquet_file
    monkeypatch.setattr(files, "parquet_file", lambda path, **options: opened.append(path) or real(path, **options))
    state = table_state(table)
    found = find_rows(state, ["k"], pa.table({"k": pa.array([101, 103], pa.int64())}), [])
    assert found is not None and sorted(found.rows.column("k").to_pylist()) == [101, 103]
    meeting = [live.uri for live in state.files
               if live.stats["minValues"]["k"] <= 103 and live.stats["maxValues"]["k"] >= 101]
    assert sorted(opened) == sorted(meeting) and len(meeting) < len(state.files)  # the update's file spans all
