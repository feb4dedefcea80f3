"""Few rows held by the driver as a local relation: the same rows and types, questions
about them answered without a Spark job, and the same key range a job over them gives;
more rows than the limit stay where Spark computed them."""

from __future__ import annotations

import datetime
from decimal import Decimal

import pytest
from float_bits import exact_value
from size_overrides import set_sizes
from spark_job_count import jobs_started

from airflow_backfill.engine import internals
from airflow_backfill.engine.delta.commits import PRESENT
from airflow_backfill.engine.delta.driver_rows import (
    arrow_of,
    distinct_rows,
    held_in_driver,
    held_rows,
    is_local,
    local_arrow,
    local_join,
    local_relation,
    select_columns,
    union_rows,
)
from airflow_backfill.engine.delta.key_range import key_range, key_range_of_table

pytestmark = pytest.mark.spark

def _computed(spark):
    """A cached frame with every column type an aggregate's groups commonly carry, NULLs too."""
    rows = spark.createDataFrame([(4, "1.25", "2020-01-04", "2020-01-04 10:00:00", "x", True, False),
                                  (None, None, None, None, None, None, True),
                                  (9, "-3.50", "1999-12-31", "2001-02-03 04:05:06", "y", None, True)],
                                 "k long, d string, day string, at string, s string, p boolean, arrived boolean")
    return rows.selectExpr("k", "CAST(d AS DECIMAL(18,2)) AS d", "CAST(day AS DATE) AS day",
                           "CAST(at AS TIMESTAMP) AS at", "s", f"p AS {PRESENT}", "arrived").cache()


def test_few_rows_are_held_as_a_local_relation_that_answers_without_a_job(spark):
    frame = _computed(spark)
    local = held_in_driver(frame)
    assert local is not None and is_local(local) and not is_local(frame)
    assert local.schema == frame.schema
    assert sorted(local.collect(), key=str) == sorted(frame.collect(), key=str)
    with jobs_started(spark) as jobs:
        narrowed = local.filter("k > 5").selectExpr("k", "d * 2 AS d2")
        assert is_local(narrowed)
        assert narrowed.collect()[0]["d2"] == Decimal("-7.00")
        assert local.filter("k < 0").limit(1).isEmpty()
        in_driver = key_range_of_table(local_arrow(local), "k", PRESENT, "arrived")
        assert jobs() == 0
    assert in_driver == key_range(frame, "k", PRESENT, "arrived")
    frame.unpersist()


def test_more_rows_than_the_limit_stay_in_spark(spark):
    frame = spark.range(50).selectExpr("id AS k")
    assert held_in_driver(frame, limit=49) is None
    held = held_in_driver(frame, limit=50)
    assert held is not None and held.count() == 50


def test_key_ranges_of_driver_rows_match_a_job_over_the_same_rows(spark):
    for rows in ([(3, True, False), (1, None, True), (None, True, None)], [(None, None, False)], []):
        frame = spark.createDataFrame(rows, f"k long, {PRESENT} boolean, arrived boolean")
        held = frame.toArrow()
        assert key_range_of_table(held, "k", PRESENT, "arrived") == key_range(frame, "k", PRESENT, "arrived")
        assert key_range_of_table(held, "k", PRESENT) == key_range(frame, "k", PRESENT)


def test_a_plan_over_a_table_is_refused_without_planning_its_scan(spark, tmp_path):
    """Optimizing a filtered Delta scan plans the scan (Delta's file skipping runs Spark
    jobs); `is_local` refuses it from its leaves, so asking costs no job."""
    uri = str(tmp_path / "t")
    spark.range(20).selectExpr("id AS k").write.format("delta").save(uri)
    changes = spark.createDataFrame([(3,), (7,)], "k long")
    joined = spark.read.format("delta").load(uri).filter("k > 2").join(changes, "k")
    with jobs_started(spark) as jobs:
        assert not is_local(joined)
        assert jobs() == 0
    assert sorted(row.k for row in joined.collect()) == [3, 7]


def _local(spark, rows, schema):
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import _parse_datatype_string

    struct = _parse_datatype_string(schema)
    table = pa.Table.from_pylist([dict(zip(struct.names, row, strict=True)) for row in rows],
                                 schema=to_arrow_schema(struct))
    local = local_relation(spark, table, struct)
    assert local is not None
    return local


@pytest.mark.parametrize("how", ["inner", "left", "left_anti", "left_semi"])
def test_joins_of_local_relations_match_spark_and_stay_local(spark, how):
    left = _local(spark, [(1, 1, "a"), (1, 2, "b"), (2, None, "c"), (None, 1, "d"), (3, 3, "e")],
                  "k long, n int, s string")
    right = _local(spark, [(1, 1, Decimal("1.50")), (1, 1, Decimal("2.50")), (2, None, Decimal("3.00")),
                           (None, 1, Decimal("4.00")), (1, 2, None)], "rk long, rn long, v decimal(9,2)")
    with jobs_started(spark) as jobs:
        joined = local_join(left, right, ["k", "n"], ["rk", "rn"], how)  # n int against rn long
        assert joined is not None and is_local(joined) and jobs() == 0
    expected = left.join(right, (left.k == right.rk) & (left.n == right.rn), how)
    assert joined.schema == expected.schema
    assert sorted(joined.collect(), key=str) == sorted(expected.collect(), key=str)


def test_what_the_driver_does_not_join_is_left_to_spark(spark):
    left = _local(spark, [(1, "a")], "k long, s string")
    assert local_join(left, spark.range(3).selectExpr("id AS k2"), ["k"], ["k2"], "inner") is None  # not local
    assert local_join(left, _local(spark, [(1, "b")], "k long, s string"), ["k"], ["k"], "inner") is None  # names
    assert local_join(left, _local(spark, [(1, "b")], "k long, s string"), ["k"], ["k"], "left_anti") is not None
    zero, negative_zero = _local(spark, [(0.0, "a")], "f double, s string"), _local(spark, [(-0.0, 1)], "g double, n long")
    assert local_join(zero, negative_zero, ["f"], ["g"], "inner") is None  # Arrow matches floats by their bits
    assert zero.join(negative_zero, zero.f == negative_zero.g).count() == 1  # where Spark takes -0.0 for 0.0
    timed = spark.createDataFrame([(1, datetime.datetime(2020, 1, 1))], "k long, t timestamp")
    assert local_arrow(timed) is None  # collected as local times, where Arrow holds instants


def test_distinct_rows_of_a_local_relation_match_spark(spark):
    local = _local(spark, [(1, "a"), (1, "a"), (None, "a"), (None, "a"), (2, None)], "k long, s string")
    distinct = distinct_rows(local, ["s", "k"])
    assert is_local(distinct)
    assert sorted(distinct.collect(), key=str) == sorted(local.select("s", "k").distinct().collect(), key=str)
    assert not is_local(distinct_rows(_computed(spark), ["k"]))  # computed rows: Spark's distinct
    floats = _local(spark, [(float("nan"),), (float("nan"),), (-0.0,), (0.0,)], "f double")
    assert distinct_rows(floats, ["f"]).count() == 2 and not is_local(distinct_rows(floats, ["f"]))


def test_columns_of_rows_the_driver_made_are_taken_from_their_arrow_rows(spark):
    local = _local(spark, [(1, "a", Decimal("1.50")), (2, None, None)], "k long, s string, v decimal(9,2)")
    assert arrow_of(local) is not None
    picked = select_columns(local, ["v", "k"], ["value", "key"])
    assert arrow_of(picked) is not None and is_local(picked)
    expected = local.selectExpr("v AS value", "k AS key")
    assert picked.schema == expected.schema and picked.collect() == expected.collect()
    computed = _computed(spark)
    spark_picked = select_columns(computed, ["k"], ["key"])  # rows the driver does not hold: Spark's select
    assert arrow_of(spark_picked) is None and not is_local(spark_picked)
    assert sorted(spark_picked.collect(), key=str) == sorted(computed.selectExpr("k AS key").collect(), key=str)
    computed.unpersist()


def test_held_rows_select_dedupe_and_join_in_arrow_and_reach_spark_once(spark, monkeypatch):
    orders = _local(spark, [(1, 10, "a"), (2, 10, "b"), (3, 20, None), (4, None, "d")], "o long, c long, s string")
    customers = _local(spark, [(10, "x"), (20, "y"), (30, "z")], "ck long, name string")
    expected = (orders.select("c").distinct().join(customers, orders.c == customers.ck, "left")
                .join(orders.select("o", "c"), "c"))
    held_orders, held_customers = held_rows(orders), held_rows(customers)
    made: list[int] = []
    create = internals.arrow_as_frame  # how rows the driver holds reach the JVM
    monkeypatch.setattr(internals, "arrow_as_frame", lambda *a, **k: made.append(1) or create(*a, **k))
    keys = held_orders.distinct(["c"])
    assert keys is not None and keys.table.num_rows == 3  # NULL is one distinct value, as in Spark
    joined = keys.join(held_customers, ["c"], ["ck"], "left")
    pairs = held_orders.select(["o", "c"], ["o2", "c2"])
    assert joined is not None and not made  # no Spark relation yet
    whole = joined.join(pairs, ["c"], ["c2"], "inner")
    assert whole is not None
    frame = whole.frame(spark)
    assert frame.schema == whole.schema and frame.unpersist() is frame  # nothing to release yet
    assert not made and is_local(frame) and arrow_of(frame) is whole.table  # the JVM gets the rows on first use
    assert sorted(frame.select("c", "ck", "name", "o2").collect(), key=str) == sorted(
        expected.select("c", "ck", "name", "o").collect(), key=str)
    assert len(made) == 1 and is_local(frame)
    frame.count()
    assert len(made) == 1  # made once
    assert held_rows(_local(spark, [(1.5,)], "f double")).distinct(["f"]) is None  # Spark groups NaN, -0.0


def test_held_rows_beyond_the_local_threshold_reach_spark_as_a_scan(spark):
    local = _local(spark, [(n, f"s{n}") for n in range(200)], "k long, s string")
    held = held_rows(local)
    spark.conf.set("spark.sql.execution.arrow.localRelationThreshold", "64")
    try:
        frame = held.frame(spark)
        assert held.local_frame(spark) is None and not is_local(frame)
        assert sorted(frame.collect()) == sorted(local.collect())
    finally:
        spark.conf.unset("spark.sql.execution.arrow.localRelationThreshold")


def _exact(table):
    return [{name: exact_value(value) for name, value in row.items()} for row in table.to_pylist()]


def test_a_union_of_local_relations_is_sparks_union_and_stays_local(spark):
    """Spark does not fold a union of local relations into one: Arrow concatenates them,
    values exactly as Spark's union gives them, under a process time zone that is not UTC."""
    from process_zone import python_in_zone

    computed = _computed(spark)
    typed = local_relation(spark, computed.toArrow(), computed.schema)
    computed.unpersist()
    first = typed.selectExpr("k", "d", "at", "CAST(k AS DOUBLE) * -0.0 AS f", "array(at) AS stamps")
    second = typed.selectExpr("k", "d", "at", "CAST('NaN' AS DOUBLE) AS f", "array(at) AS stamps").where("k > 5")
    with python_in_zone("Asia/Kolkata"), jobs_started(spark) as jobs:
        union = union_rows([first, second, first])
        assert is_local(union) and jobs() == 0
        held = local_arrow(union)
    expected = first.unionByName(second).unionByName(first)
    assert not is_local(expected)  # what the Arrow union saves: every step after it would run a job
    assert union.schema == expected.schema
    assert held is not None and _exact(held) == _exact(expected.toArrow())
    cached = spark.createDataFrame(first.toArrow(), first.schema).cache()
    try:
        not_local = union_rows([first, cached])
        assert not is_local(not_local) and not_local.count() == 6
    finally:
        cached.unpersist()


def test_local_rows_reach_arrow_without_a_job_as_instants_whatever_the_process_time_zone(spark):
    """Spark's own converter turns a local relation's rows into Arrow in the JVM: timestamps
    stay the instants they are, nested ones too, under a process time zone that is not UTC
    (collected as Python objects they became local wall times read as UTC)."""
    from process_zone import python_in_zone

    computed = _computed(spark)
    source = local_relation(spark, computed.toArrow(), computed.schema)
    computed.unpersist()
    projected = source.selectExpr("k", "d * 2 AS d2", "at", "struct(at, day) AS nested", "array(at) AS stamps",
                                  f"{PRESENT}")
    expected = projected.toArrow()  # a Spark job: the reference
    with python_in_zone("America/New_York"), jobs_started(spark) as jobs:
        held = local_arrow(projected)
        assert jobs() == 0
    assert held is not None
    assert held.schema == expected.schema and held.to_pylist() == expected.to_pylist()
    assert held.column("at").type.tz == "UTC"


def test_the_driver_holds_a_table_whole_only_within_its_rows_and_bytes(tmp_path, monkeypatch):
    import pyarrow as pa
    from deltalake import write_deltalake

    from airflow_backfill.engine.delta import driver_rows

    uri = str(tmp_path / "t")
    write_deltalake(uri, pa.table({"k": pa.array(range(1000), pa.int64()), "s": pa.array(["x" * 40] * 1000)}))
    assert driver_rows.held_whole(uri)
    set_sizes(monkeypatch, held_table_rows=999)
    assert not driver_rows.held_whole(uri)
    set_sizes(monkeypatch, held_table_rows=1000)
    set_sizes(monkeypatch, held_table_bytes=100)  # wide rows: the files' bytes bound it first
    assert not driver_rows.held_whole(uri)
