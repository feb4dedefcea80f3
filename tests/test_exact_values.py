"""Whole rows grouped by their exact values (`engine/rounds/exact_values.py`), held to the
comparison the recompute's difference makes: rows the same in every column (`same_value`)
fall in one group, a row that differs in any one column of any type in its own, and the
values come out as they went in. Spark 4.2's own grouping takes -0.0 for 0.0 and, in code
it generates (as phases run it), turns a map's NULL numbers into zeros."""

from __future__ import annotations

import pytest
from test_difference import COLUMNS, rows

from airflow_backfill.engine.rounds.exact_values import all_of, grouped_rows, same_value

pytestmark = pytest.mark.spark

CODEGEN = {"spark.sql.codegen.wholeStage": "true", "spark.sql.codegen.factoryMode": "FALLBACK"}
"""Spark's defaults, as phases run (the tests' session turns code generation off, and with
it Spark's bug with maps)."""


@pytest.fixture
def generating(spark):
    saved = {name: spark.conf.get(name, None) for name in CODEGEN}
    for name, value in CODEGEN.items():
        spark.conf.set(name, value)
    yield spark
    for name, value in saved.items():
        if value is None:
            spark.conf.unset(name)
        else:
            spark.conf.set(name, value)


def every_variant(spark):
    """The base row twice, each value written otherwise once, each differing value once;
    all with the same id, so only the columns tell them apart."""
    names = list(COLUMNS)
    variants = [{}, {}]
    variants += [{name: COLUMNS[name][1]} for name in names if COLUMNS[name][1]]
    variants += [{name: COLUMNS[name][2]} for name in names]
    frames = [rows(spark, {1: variant}) for variant in variants]
    union = frames[0]
    for frame in frames[1:]:
        union = union.unionByName(frame)
    return union.localCheckpoint(), variants


def test_rows_group_exactly_as_the_difference_compares_them(generating):
    spark = generating
    from pyspark.sql import functions as F

    frame, variants = every_variant(spark)
    columns = frame.columns
    grouped = grouped_rows(frame.withColumn("n", F.lit(1)), columns, {"n": F.sum("n")}).localCheckpoint()
    assert grouped.columns == [*columns, "n"]
    assert [field.dataType for field in grouped.schema.fields[:-1]] == [field.dataType for field in frame.schema]
    equal_otherwise = sum(1 for name in COLUMNS if COLUMNS[name][1])
    counts = sorted(row["n"] for row in grouped.collect())
    assert counts == sorted([2 + equal_otherwise] + [1] * len(COLUMNS)), counts

    # every group's row is one of the rows that went in, held as many times as the group counts
    schema = {field.name: field.dataType for field in frame.schema.fields}
    matched = grouped.alias("g").crossJoin(frame.alias("r")).where(all_of(
        [same_value(F.col(f"g.`{name}`"), F.col(f"r.`{name}`"), schema[name]) for name in columns]))
    held = {tuple(row) for row in matched.groupBy("g.n").agg(F.count(F.lit(1)).alias("rows")).collect()}
    assert all(n == rows_held for n, rows_held in held if n > 1)
    assert matched.count() == len(variants)


@pytest.mark.parametrize("column, ddl, value", [
    ("mp", "MAP<STRING, INT>", {"a": 1, "b": None}),
    ("st", "STRUCT<m: MAP<STRING, DOUBLE>>", {"m": {"z": None}}),
])
def test_a_maps_null_numbers_stay_null_where_sparks_grouping_makes_them_zero(generating, column, ddl, value):
    spark = generating
    from pyspark.sql import functions as F

    frame = spark.createDataFrame([(1, value)], f"id INT, {column} {ddl}").localCheckpoint()
    (row,) = grouped_rows(frame, ["id", column], {"n": F.count(F.lit(1))}).collect()
    assert (row.asDict(recursive=True)[column], row["n"]) == (value, 1)
