"""The MIN, MAX and COUNT(DISTINCT) of groups the driver recomputes from an upstream's rows
equal Spark's recompute of the same groups as of the same version, for every column type
Arrow folds, with NULL keys and values, edge values, deletion vectors and several process
time zones; what Arrow would not fold as Spark does is left to Spark."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest
import typed_tables as typed
from process_zone import python_in_zone

from airflow_backfill.engine.aggregates.group_rows import recomputed_groups
from airflow_backfill.engine.delta.change_feed import read_upstream_as_of
from airflow_backfill.engine.delta.driver_rows import is_local, local_relation
from airflow_backfill.engine.delta.log import load_table
from airflow_backfill.engine.planning import aggregate_sql as sql
from airflow_backfill.engine.planning.query import plan_query

pytestmark = pytest.mark.spark

FOLDED = ["flag", "b", "sm", "i", "l", "dec", "money", "s", "day", "ts", "ntz"]
"""Columns whose MIN, MAX and COUNT(DISTINCT) the driver folds."""


@pytest.fixture(scope="module")
def upstream(spark, tmp_path_factory) -> str:
    """A typed upstream of 400 rows, then a MERGE that updates 60 rows and deletes 40
    (deletion vectors: the driver must skip the deleted rows as Spark does)."""
    uri = str(tmp_path_factory.mktemp("recompute") / "typed")
    rows = typed.TypedRows(11)
    typed.write_new_table(spark, uri, typed.arrow_rows([rows.typed(i) for i in range(400)], typed.typed_schema()),
                          typed.TYPED_DDL)
    updates = typed.arrow_rows([rows.typed(i) for i in range(0, 300, 5)], typed.typed_schema())
    typed.merge_rows(spark, uri, updates, typed.TYPED_DDL, "id", list(range(3, 400, 10)))
    return uri


def _both(spark, uri: str, query: str, groups: pa.Table):
    """(`recomputed_groups`' rows, Spark's recompute) of `groups` at the upstream's version."""
    aggregate = plan_query(query, ("id",)).aggregate
    version = load_table(uri).version()
    source = read_upstream_as_of(spark, uri, version)
    source.createOrReplaceTempView("source")
    state = spark.sql(sql.state_sql(aggregate)).schema
    keys = local_relation(spark, groups, type(state)([state[name] for name in groups.column_names]))
    keys.createOrReplaceTempView("__recompute_keys")
    mine = recomputed_groups(spark, uri, aggregate, "__recompute_keys", version, state)
    source.createOrReplaceTempView("source")
    return mine, spark.sql(sql.recompute_sql(aggregate, "__recompute_keys"))


def _rows(frame) -> list[tuple]:
    """Rows as Arrow gives them (no value through Python's local time), in a stable order."""
    return sorted((tuple(row.values()) for row in frame.toArrow().to_pylist()), key=repr)


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b  # -0.0 == 0.0: either is Spark's extreme
    return a == b


def _assert_equal(by_driver, by_spark, *, folded: bool = True) -> None:
    assert is_local(by_driver) == folded, "the driver folds these groups" if folded else "Spark folds these"
    assert by_driver.schema == by_spark.schema
    got, expected = _rows(by_driver), _rows(by_spark)
    assert len(got) == len(expected) and expected
    for mine, theirs in zip(got, expected, strict=True):
        assert all(_same(a, b) for a, b in zip(mine, theirs, strict=True)), (mine, theirs)


GROUPS = pa.table({"__g0": ["north", "south", "ü", None, "absent"]})


@pytest.mark.parametrize("zone", ["America/New_York", "Asia/Kolkata", "UTC"])
def test_every_folded_type_equals_sparks_recompute(spark, upstream, zone):
    columns = ", ".join(f"MIN({c}) AS min_{c}, MAX({c}) AS max_{c}, COUNT(DISTINCT {c}) AS d_{c}" for c in FOLDED)
    with python_in_zone(zone):
        _assert_equal(*_both(spark, upstream, f"SELECT grp, {columns} FROM source GROUP BY grp", GROUPS))


@pytest.mark.parametrize("zone", ["America/New_York", "UTC"])
def test_floating_point_extremes_equal_sparks_with_nan_and_signed_zeros(spark, upstream, zone):
    query = "SELECT grp, MIN(f) AS fmin, MAX(f) AS fmax, MIN(d) AS dmin, MAX(d) AS dmax FROM source GROUP BY grp"
    with python_in_zone(zone):
        by_driver, by_spark = _both(spark, upstream, query, GROUPS)
    _assert_equal(by_driver, by_spark)
    assert any(isinstance(v, float) and math.isnan(v) for row in _rows(by_spark) for v in row), "NaN extremes"


@pytest.mark.parametrize(("keys", "groups"), [
    ("flag, day", pa.table({"__g0": [True, False, None], "__g1": pa.array([None, *typed.DATES[:2]], pa.date32())})),
    ("b", pa.table({"__g0": pa.array([-128, 127, 0, None, 5], pa.int8())})),
])
def test_keys_of_other_types_and_several_columns_equal_sparks(spark, upstream, keys, groups):
    query = f"SELECT {keys}, MIN(s) AS smin, MAX(ts) AS tmax, COUNT(DISTINCT money) AS dm FROM source GROUP BY {keys}"
    _assert_equal(*_both(spark, upstream, query, groups))


@pytest.mark.parametrize("zone", ["America/New_York", "Asia/Kolkata"])
def test_where_and_expressions_over_the_rows_the_driver_finds_equal_sparks_recompute(spark, upstream, zone):
    """A WHERE and argument expressions: Spark folds the groups' rows the driver found (a
    local relation; the session's time zone for the date of a timestamp)."""
    columns = ", ".join(f"MIN({c}) AS min_{c}, MAX({c}) AS max_{c}, COUNT(DISTINCT {c}) AS d_{c}" for c in FOLDED)
    query = (f"SELECT grp, {columns}, MAX(lower(s)) AS ls, MIN(abs(CAST(i AS BIGINT))) AS ai, "
             "COUNT(DISTINCT substr(s, 1, 2)) AS prefixes, MAX(CAST(ts AS DATE)) AS last_day, "
             "MIN(money * 2) AS twice FROM source WHERE id % 3 <> 0 AND (l IS NULL OR l > -100) GROUP BY grp")
    with python_in_zone(zone):
        _assert_equal(*_both(spark, upstream, query, GROUPS), folded=False)


@pytest.mark.parametrize("query", [
    "SELECT grp, COUNT(DISTINCT d) AS dd FROM source GROUP BY grp",  # Spark counts -0.0 as 0.0
    "SELECT grp, MIN(bin) AS bmin FROM source GROUP BY grp",  # binary order: not taken
    "SELECT d, MIN(i) AS imin FROM source GROUP BY d",  # a floating-point key
])
def test_what_arrow_would_not_fold_as_spark_is_left_to_spark(spark, upstream, query):
    groups = pa.table({"__g0": ["north", None]}) if "grp" in query else pa.table({"__g0": [0.0, 1.5, None]})
    _assert_equal(*_both(spark, upstream, query, groups), folded=False)
