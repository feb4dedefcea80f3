"""The independent checker every correctness test uses.

It recomputes the MV query on the upstream *as of* an epoch with DuckDB (the Spark SQL
transpiled by sqlglot) and compares the result with the MV's rows as multisets. It shares
no code with `airflow_backfill` on purpose: a bug in the engine cannot hide itself by
also being in the check.

Also a command: `python tests/oracle.py --job jobs/orders_mv.yaml [--every-commit]`
checks a job's MV at its current watermark (or at every MV commit) and exits 1 on a
mismatch.
"""

from __future__ import annotations

import argparse
import datetime as dt
import decimal
import json
import math
import os
import string
import sys
from collections import Counter
from collections.abc import Sequence
from typing import Any

import duckdb
import pyarrow as pa
import sqlglot
from deltalake import DeltaTable, QueryBuilder

SIGNIFICANT_DIGITS = 9
"""Floats are compared after rounding to this many significant digits..."""
REL_TOLERANCE = 1e-7
"""...and rows still unmatched are paired up if their floats are this close (relative)."""
SHOWN_ROWS = 5
_PAIRING_LIMIT = 1_000_000


# ---- reading both sides -----------------------------------------------------------------


def table_rows(uri: str, version: int | None = None) -> pa.Table:
    """A Delta table's rows as of `version` (latest when None), read by delta-rs, whose
    query engine applies deletion vectors (its plain Arrow dataset refuses them)."""
    table = DeltaTable(uri, version=version)
    result = QueryBuilder().register("t", table).execute("SELECT * FROM t").read_all()
    rows = pa.table(result)
    schema = pa.schema([
        field.with_type(pa.string()) if pa.types.is_string_view(field.type)
        else field.with_type(pa.binary()) if pa.types.is_binary_view(field.type) else field
        for field in rows.schema
    ])
    return rows.cast(schema)


def upstream_rows(upstream_uri: str, version: int) -> pa.Table:
    """The upstream's rows as of `version` (delta-rs time travel)."""
    return table_rows(upstream_uri, version)


def expected_rows(
    upstream_uri: str, version: int, query: str, *, table_name: str = "source", dialect: str = "spark"
) -> pa.Table:
    """The MV query evaluated by DuckDB on the upstream as of `version`."""
    duckdb_sql = sqlglot.transpile(query, read=dialect, write="duckdb")
    if len(duckdb_sql) != 1:
        raise ValueError(f"expected exactly one SQL statement, got {len(duckdb_sql)}: {query!r}")
    connection = duckdb.connect()
    try:
        connection.execute("SET TimeZone = 'UTC'")
        connection.register(table_name, upstream_rows(upstream_uri, version))
        return pa.table(connection.sql(duckdb_sql[0]).to_arrow_table())
    finally:
        connection.close()


def mv_watermark(target: str, app_id: str, mv_version: int | None = None) -> int | None:
    """The upstream epoch recorded by the MV's app transaction at `mv_version` (None if absent)."""
    version = DeltaTable(target, version=mv_version).transaction_version(app_id)
    return None if version is None else int(version)


def mv_rows(target: str, mv_version: int | None = None) -> pa.Table:
    """The MV's rows at `mv_version` (latest when None)."""
    return table_rows(target, mv_version)


# ---- normalising rows -------------------------------------------------------------------


def _normalise(value: Any) -> Any:
    """A value that compares equal across engines: floats rounded, timestamps in UTC."""
    if value is None or isinstance(value, bool | str | bytes | int):
        return value
    if isinstance(value, decimal.Decimal):
        value = float(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value) or value == 0.0:
            return value + 0.0  # also turns -0.0 into 0.0
        return float(f"{value:.{SIGNIFICANT_DIGITS}g}")
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.UTC)
        return value.astimezone(dt.UTC)
    if isinstance(value, dict):
        return tuple(sorted((key, _normalise(item)) for key, item in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_normalise(item) for item in value)
    return value


def _sort_key(row: tuple) -> tuple:
    """Orders rows holding None and mixed types without comparing unlike values."""
    return tuple((value is not None, type(value).__name__, value if value is not None else 0) for value in row)


def normalised_rows(table: pa.Table, columns: Sequence[str]) -> list[tuple]:
    """The rows of `table` as tuples of normalised values, sorted by all columns."""
    data = [table.column(name).to_pylist() for name in columns]
    rows = [tuple(_normalise(value) for value in values) for values in zip(*data, strict=True)]
    return sorted(rows, key=_sort_key)


def _close(left: tuple, right: tuple) -> bool:
    for a, b in zip(left, right, strict=True):
        if isinstance(a, float) and isinstance(b, float | int) or isinstance(b, float) and isinstance(a, int):
            if not math.isclose(a, b, rel_tol=REL_TOLERANCE, abs_tol=REL_TOLERANCE):
                return False
        elif a != b:
            return False
    return True


def _pair_close_rows(missing: list[tuple], extra: list[tuple]) -> tuple[list[tuple], list[tuple]]:
    """Drop (missing, extra) pairs whose only differences are float noise."""
    if len(missing) * len(extra) > _PAIRING_LIMIT:
        return missing, extra
    unmatched_extra = list(extra)
    still_missing = []
    for row in missing:
        match = next((i for i, other in enumerate(unmatched_extra) if _close(row, other)), None)
        if match is None:
            still_missing.append(row)
        else:
            del unmatched_extra[match]
    return still_missing, unmatched_extra


# ---- comparing --------------------------------------------------------------------------


def _show(columns: Sequence[str], rows: list[tuple]) -> list[str]:
    shown = [f"    {dict(zip(columns, row, strict=True))}" for row in rows[:SHOWN_ROWS]]
    if len(rows) > SHOWN_ROWS:
        shown.append(f"    ... and {len(rows) - SHOWN_ROWS} more")
    return shown


def duplicate_keys(table: pa.Table, key: Sequence[str]) -> list[tuple[dict, int]]:
    """MV key values that appear more than once, with their counts."""
    data = [table.column(name).to_pylist() for name in key]
    counts = Counter(tuple(_normalise(v) for v in values) for values in zip(*data, strict=True))
    duplicates = [(dict(zip(key, k, strict=True)), n) for k, n in counts.items() if n > 1]
    return sorted(duplicates, key=lambda item: _sort_key(tuple(item[0].values())))


def at_mv_scale(expected: pa.Table, actual: pa.Table) -> pa.Table:
    """`expected` with each column the MV stores as DECIMAL(p, s) rounded half-up to scale s.

    Spark types AVG of a DECIMAL(p, s) as DECIMAL(p + 4, s + 4) and rounds to it, where
    DuckDB returns a DOUBLE; rounding the recomputation to the MV's declared scale makes
    the two comparable without loosening the comparison of any other column.
    """
    columns = []
    for name in expected.column_names:
        column = expected.column(name)
        target = actual.schema.field(name).type if name in actual.column_names else None
        if target is not None and pa.types.is_decimal(target) and column.type != target:
            step = decimal.Decimal(1).scaleb(-target.scale)
            column = pa.array([
                None if value is None else decimal.Decimal(str(value)).quantize(step, decimal.ROUND_HALF_UP)
                for value in column.to_pylist()
            ], type=pa.decimal128(38, target.scale))
        columns.append(column)
    return pa.table(columns, names=expected.column_names)


def diff_rows(expected: pa.Table, actual: pa.Table, *, key: Sequence[str] | None = None) -> list[str]:
    """Problems found comparing `actual` (the MV) with `expected`; empty when they match."""
    expected = at_mv_scale(expected, actual)
    expected_columns = list(expected.column_names)
    actual_columns = list(actual.column_names)
    if sorted(expected_columns) != sorted(actual_columns):
        return [
            f"columns differ: the query gives {expected_columns}, the MV has {actual_columns} "
            f"(missing {sorted(set(expected_columns) - set(actual_columns))}, "
            f"unexpected {sorted(set(actual_columns) - set(expected_columns))})"
        ]
    problems = []
    if key:
        absent = [name for name in key if name not in actual_columns]
        if absent:
            problems.append(f"MV key column(s) {absent} are not MV columns {actual_columns}")
        else:
            duplicates = duplicate_keys(actual, key)
            if duplicates:
                problems.append(f"{len(duplicates)} MV key value(s) appear more than once (first {SHOWN_ROWS}):")
                problems.extend(f"    {value} x{count}" for value, count in duplicates[:SHOWN_ROWS])
    expected_count = Counter(normalised_rows(expected, expected_columns))
    actual_count = Counter(normalised_rows(actual, expected_columns))
    missing = sorted((expected_count - actual_count).elements(), key=_sort_key)
    extra = sorted((actual_count - expected_count).elements(), key=_sort_key)
    missing, extra = _pair_close_rows(missing, extra)
    if missing or extra:
        problems.append(f"the query gives {expected.num_rows} rows, the MV has {actual.num_rows}")
    if missing:
        problems.append(f"{len(missing)} row(s) missing from the MV:")
        problems.extend(_show(expected_columns, missing))
    if extra:
        problems.append(f"{len(extra)} row(s) in the MV that the query does not give:")
        problems.extend(_show(expected_columns, extra))
    return problems


def assert_rows_match(expected: pa.Table, actual: pa.Table, *, key: Sequence[str] | None = None,
                      context: str = "MV") -> None:
    """Fail with a readable diff unless `actual` equals `expected` as a multiset."""
    problems = diff_rows(expected, actual, key=key)
    if problems:
        raise AssertionError("\n".join([f"{context} does not match the query:", *problems]))


def assert_mv_matches(
    upstream_uri: str,
    target: str,
    query: str,
    app_id: str,
    mv_version: int | None = None,
    *,
    key: Sequence[str] | None = None,
) -> int:
    """Check the MV at `mv_version` against the query on the upstream at its watermark.

    Returns the watermark that was checked.
    """
    watermark = mv_watermark(target, app_id, mv_version)
    label = "latest" if mv_version is None else mv_version
    if watermark is None:
        raise AssertionError(f"MV {target} at version {label} has no watermark for app id {app_id!r}")
    assert_rows_match(
        expected_rows(upstream_uri, watermark, query),
        mv_rows(target, mv_version),
        key=key,
        context=f"MV {target} at version {label} (watermark {watermark})",
    )
    return watermark


def assert_every_commit_matches(
    upstream_uri: str, target: str, query: str, app_id: str, key: Sequence[str] | None = None
) -> int:
    """Check every MV version at its own watermark; watermarks must never go back.

    The versions before the first watermark are a snapshot's chunks (an MV being created,
    not yet readable as the MV); from the first watermark on, every version must have one.
    Returns the number of MV versions checked.
    """
    latest = DeltaTable(target).version()
    expected_by_epoch: dict[int, pa.Table] = {}
    previous: int | None = None
    checked = 0
    for mv_version in range(latest + 1):
        watermark = mv_watermark(target, app_id, mv_version)
        if watermark is None and previous is None:
            continue
        if watermark is None:
            raise AssertionError(f"MV {target} version {mv_version} has no watermark for app id {app_id!r}")
        if previous is not None and watermark < previous:
            raise AssertionError(
                f"MV {target}: the watermark moved backwards from {previous} to {watermark} "
                f"at MV version {mv_version}"
            )
        if watermark not in expected_by_epoch:
            expected_by_epoch[watermark] = expected_rows(upstream_uri, watermark, query)
        assert_rows_match(
            expected_by_epoch[watermark],
            mv_rows(target, mv_version),
            key=key,
            context=f"MV {target} at version {mv_version} (watermark {watermark})",
        )
        previous = watermark
        checked += 1
    if not checked:
        raise AssertionError(f"MV {target} has no version with a watermark for app id {app_id!r}")
    return checked


# ---- joins: one recorded version per upstream -------------------------------------------


def expected_join_rows(upstreams: dict[str, str], versions: dict[str, int], query: str) -> pa.Table:
    """The join MV query evaluated by DuckDB with each upstream (by its name in the job's
    `sources`) as of its own version."""
    duckdb_sql = sqlglot.transpile(query, read="spark", write="duckdb")
    if len(duckdb_sql) != 1:
        raise ValueError(f"expected exactly one SQL statement, got {len(duckdb_sql)}: {query!r}")
    connection = duckdb.connect()
    try:
        connection.execute("SET TimeZone = 'UTC'")
        for name, uri in upstreams.items():
            connection.register(name, upstream_rows(uri, versions[name]))
        return pa.table(connection.sql(duckdb_sql[0]).to_arrow_table())
    finally:
        connection.close()


def mv_vector(target: str, app_id: str, mv_version: int) -> dict[str, int] | None:
    """The upstream versions MV version `mv_version` reflects: the vector in the commit
    metadata of the newest commit up to it that carries one, checked against the app
    transaction (which must be the vector's sum). None before the first watermark."""
    watermark = mv_watermark(target, app_id, mv_version)
    if watermark is None:
        return None
    for entry in DeltaTable(target).history():  # newest first
        if entry["version"] > mv_version:
            continue
        text = json.loads(entry.get("userMetadata") or "{}").get("airflow_backfill.watermarks")
        if text is not None:
            vector = {name: int(version) for name, version in json.loads(text).items()}
            if sum(vector.values()) != watermark:
                raise AssertionError(
                    f"MV {target} version {mv_version}: vector {vector} does not sum to its app transaction "
                    f"{watermark}"
                )
            return vector
    raise AssertionError(f"MV {target} version {mv_version} has a watermark but no recorded vector")


def assert_every_join_commit_matches(
    upstreams: dict[str, str], target: str, query: str, app_id: str, key: Sequence[str] | None = None
) -> list[dict[str, int]]:
    """Check every MV version against the query over each upstream as of its recorded
    version; no upstream's version may ever move back. Returns the vectors checked."""
    latest = DeltaTable(target).version()
    previous: dict[str, int] | None = None
    checked: list[dict[str, int]] = []
    for mv_version in range(latest + 1):
        vector = mv_vector(target, app_id, mv_version)
        if vector is None and previous is None:
            continue  # a snapshot's chunks
        if vector is None:
            raise AssertionError(f"MV {target} version {mv_version} has no watermark for app id {app_id!r}")
        if sorted(vector) != sorted(upstreams):
            raise AssertionError(f"MV {target} version {mv_version} records {vector}, not one version per upstream")
        if previous is not None and any(vector[name] < previous[name] for name in vector):
            raise AssertionError(f"MV {target}: an upstream's version moved back from {previous} to {vector} "
                                 f"at MV version {mv_version}")
        assert_rows_match(
            expected_join_rows(upstreams, vector, query), mv_rows(target, mv_version), key=key,
            context=f"MV {target} at version {mv_version} (versions {vector})",
        )
        previous = vector
        checked.append(vector)
    if not checked:
        raise AssertionError(f"MV {target} has no version with a watermark for app id {app_id!r}")
    return checked


# ---- command line -----------------------------------------------------------------------


def _expand(path: str) -> str:
    """A job file path as the job loader reads it: `~`, `${VARS}` and file:// handled."""
    home = os.path.expanduser(os.environ.get("AIRFLOW_BACKFILL_HOME") or "~/airflow_backfill")
    variables = {**os.environ, "AIRFLOW_BACKFILL_HOME": home}
    path = path.removeprefix("file://")
    return os.path.abspath(os.path.expanduser(string.Template(path).substitute(variables)))


def main(argv: Sequence[str] | None = None) -> int:
    import yaml

    parser = argparse.ArgumentParser(description="Check a job's MV against its query recomputed with DuckDB.")
    parser.add_argument("--job", required=True, help="the job's YAML file")
    parser.add_argument("--every-commit", action="store_true", help="check every MV version, not just the latest")
    args = parser.parse_args(argv)
    with open(args.job) as handle:
        job = yaml.safe_load(handle)
    source, target = _expand(job["source"]), _expand(job["target"])
    app_id = f"airflow_backfill/{job['name']}"
    primary_key = job.get("primary_key") or []
    primary_key = [primary_key] if isinstance(primary_key, str) else list(primary_key)
    columns = pa.schema(DeltaTable(target).schema().to_arrow()).names
    key = primary_key if all(name in columns for name in primary_key) else None
    try:
        if args.every_commit:
            checked = assert_every_commit_matches(source, target, job["query"], app_id, key=key)
            print(f"OK: all {checked} MV versions match the query at their watermarks")
        else:
            watermark = assert_mv_matches(source, target, job["query"], app_id, key=key)
            rows = mv_rows(target).num_rows
            print(f"OK: the MV ({rows} rows) matches the query on the upstream at epoch {watermark}")
    except AssertionError as error:
        print(f"MISMATCH: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
