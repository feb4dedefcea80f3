"""The driver's lookup of a Delta table's rows at a few keys: exactly the rows whose key
columns equal some key (NULL never does), as of the version asked, read only from the
files and row groups whose statistics leave room for a key; and no answer (Spark reads
instead) for a key type it cannot compare, or beyond its limits. Tables with deletion
vectors: tests/test_keyed_rows.py."""

from __future__ import annotations

import datetime

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, WriterProperties, write_deltalake
from size_overrides import set_sizes

from airflow_backfill.engine.delta.driver_lookup import lookup_rows
from airflow_backfill.storage import files

SCHEMA = pa.schema([("k", pa.int64()), ("n", pa.int32()), ("s", pa.string()), ("d", pa.date32()),
                    ("v", pa.decimal128(9, 2))])


def _rows(keys: range, n: int = 2) -> pa.Table:
    rows = [{"k": k, "n": i, "s": f"s{k:03d}", "d": datetime.date(2020, 1, 1) + datetime.timedelta(days=k),
             "v": f"{k}.{i}"} for k in keys for i in range(n)]
    return pa.Table.from_pylist([{**r, "v": __import__("decimal").Decimal(r["v"])} for r in rows], schema=SCHEMA)


@pytest.fixture
def table(tmp_path) -> str:
    """Three files of keys 0-9, 10-19 and 20-29 (two rows a key), row groups of four rows;
    version 2 holds them all."""
    uri = str(tmp_path / "t")
    for keys in (range(0, 10), range(10, 20), range(20, 30)):
        write_deltalake(uri, _rows(keys), mode="append", writer_properties=WriterProperties(max_row_group_size=4))
    return uri


def _expected(uri: str, version: int, column: str, values: list) -> list[dict]:
    rows = DeltaTable(uri, version=version).to_pyarrow_table()
    return sorted(rows.filter(pc.is_in(rows.column(column), pa.array(values, rows.schema.field(column).type)))
                  .to_pylist(), key=lambda r: (r["k"], r["n"]))


def _looked_up(uri, version, keys: pa.Table, key_columns, columns=SCHEMA.names) -> list[dict] | None:
    found = lookup_rows(uri, version, list(columns), list(key_columns), keys)
    if found is None:
        return None
    rows, schema = found
    assert schema.names == list(columns)
    return sorted(rows.to_pylist(), key=lambda r: (r["k"], r["n"]))


def test_rows_at_the_keys_are_read_from_the_files_that_can_hold_them(table, monkeypatch):
    opened = []
    real = files.parquet_file
    monkeypatch.setattr(files, "parquet_file", lambda path, **options: opened.append(path) or real(path, **options))
    keys = pa.table({"key": pa.array([3, 15, 15, 40, None], pa.int32())})  # another integer type than the table's
    found = _looked_up(table, 2, keys, ["k"])
    assert found == _expected(table, 2, "k", [3, 15]) and len(found) == 4
    assert len(opened) == 2  # keys 20 - 29 cannot hold a key; 40 is beyond every file


def test_a_key_of_several_columns_matches_all_of_them(table):
    keys = pa.table({"a": [3, 3, 17, 5], "b": [0, 1, 1, 9]})
    found = _looked_up(table, 2, keys, ["k", "n"])
    assert [(r["k"], r["n"]) for r in found] == [(3, 0), (3, 1), (17, 1)]


def test_a_null_key_never_matches(tmp_path):
    uri = str(tmp_path / "t")
    write_deltalake(uri, pa.table({"k": pa.array([1, None, 2], pa.int64()), "n": pa.array([1, 2, 3], pa.int32())}))
    found = lookup_rows(uri, 0, ["k", "n"], ["k"], pa.table({"k": pa.array([None, 2], pa.int64())}))
    assert found is not None and found[0].to_pylist() == [{"k": 2, "n": 3}]


def test_rows_are_read_as_of_the_version_asked(table):
    DeltaTable(table).delete("k = 3")
    DeltaTable(table).update({"s": "'changed'"}, predicate="k = 25")
    keys = pa.table({"k": [3, 25]})
    assert _looked_up(table, 2, keys, ["k"]) == _expected(table, 2, "k", [3, 25])
    now = _looked_up(table, 4, keys, ["k"])
    assert now == _expected(table, 4, "k", [3, 25]) and {r["s"] for r in now} == {"changed"}


@pytest.mark.parametrize("column, values", [
    ("s", ["s004", "s021", "nope"]),
    ("d", [datetime.date(2020, 1, 5), datetime.date(2021, 1, 1)]),
    ("v", [__import__("decimal").Decimal("7.1")]),
])
def test_string_date_and_decimal_keys(table, column, values):
    keys = pa.table({column: pa.array(values, SCHEMA.field(column).type)})
    assert _looked_up(table, 2, keys, [column]) == _expected(table, 2, column, values) != []


def test_no_answer_where_spark_must_read(table, tmp_path, monkeypatch):
    keys = pa.table({"k": [3, 15]})
    assert _looked_up(table, 2, pa.table({"x": [1.5]}), ["n"]) is None  # not an integer: Spark compares it as a double
    assert _looked_up(table, 2, pa.table({"x": [1.0]}), ["n"]) == _expected(table, 2, "n", [1])
    floats = str(tmp_path / "floats")
    write_deltalake(floats, pa.table({"f": [1.5, float("nan")], "k": [1, 2]}))
    assert lookup_rows(floats, 0, ["f", "k"], ["f"], pa.table({"f": [1.5]})) is None  # NaN compares otherwise
    assert lookup_rows(table, 2, ["k", "missing"], ["k"], keys) is None
    for limit, value in (("lookup_keys", 1), ("lookup_rows", 3), ("scan_rows", 19)):
        with monkeypatch.context() as patched:
            set_sizes(patched, **{limit: value})
            assert _looked_up(table, 2, keys, ["k"]) is None, limit
    set_sizes(monkeypatch, scan_rows=20)  # one file of 20 rows: within the limit
    assert _looked_up(table, 2, pa.table({"k": [3]}), ["k"]) == _expected(table, 2, "k", [3])
