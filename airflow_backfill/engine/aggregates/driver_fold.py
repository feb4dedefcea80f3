"""Fold a round's few change rows into a state the driver holds, with Arrow.

Why: when the signed change rows and the state are both local relations (a small feed
folded into a small state, the usual catch-up and forward round), the only steps of the
fold that Spark cannot answer from the driver's rows are the GROUP BY of the change rows
and their join with the old state. Spark runs them as a statement of several jobs (its
shuffle stages, 0.3 - 0.4 s for TPC-H Q3's rounds at SF 1) for a few thousand rows. Here
Spark still evaluates the query's expressions (WHERE, the GROUP BY keys, the aggregate
arguments) over the local rows, where its optimizer folds them without a job; Arrow
combines the terms per group and joins the old state; the result is a local relation
again, so the projections after it (the new state, the MV change) run no job either.

Only what Arrow computes as Spark does is taken: sums of integers and decimals, exactly
(each term already cast to the type Spark's SUM gives it; a sum that could overflow is
left to Spark, which raises), MIN/MAX of types Arrow orders as Spark does, group keys
without floating-point values and without NULLs (Spark groups NaN and -0.0, and joins
NULL keys with `<=>`). Anything else returns None and Spark folds the rows as before.

MIN and MAX of floating-point values are taken with Spark's order, in which NaN is the
largest value: Arrow skips NaN unless a group holds nothing else, which gives Spark's MIN,
and a MAX whose group holds a NaN is NaN. Zeros of either sign compare equal in both, and
either may be the extreme found (Spark's too depends on the rows' order).

Floating-point sums are taken too, with IEEE arithmetic as Spark's (NaN and infinities
propagate alike, an all-NULL group sums to NULL): the terms are added in another order
than Spark's partial and final aggregates add them, which moves only the last bits (terms
so large that some order would overflow are left to Spark). That
order is no part of Spark's result either (it follows the rows' partitions), and an MV's
floating-point sums are not exact against a recompute in any case (docs/aggregates.md).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from airflow_backfill.engine.delta.driver_rows import arrow_of, local_arrow, local_relation
from airflow_backfill.engine.planning import aggregate_sql as sql

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from airflow_backfill.engine.planning.aggregate_query import AggregateQuery

log = logging.getLogger(__name__)

_SAFE_INTEGER_TOTAL = 2.0 ** 62
"""Integer terms whose absolute values add up to less than this cannot overflow a 64-bit
sum in any order (Arrow's integer sums wrap where Spark's raise)."""

_SAFE_FLOAT_TOTAL = 2.0 ** 1000
"""Finite floating-point terms whose absolute values add up to less than this reach no
infinity in any order of adding, so the order moves only the last bits of a sum (near the
largest double, one order overflows where another does not)."""


def touched_in_driver(
    spark: SparkSession, aggregate: AggregateQuery, changes_view: str, state: DataFrame,
    leaving_groups: DataFrame | None, widened: frozenset[int] = frozenset(),
) -> DataFrame | None:
    """Per group the signed rows in `changes_view` touch: the delta `delta_sql` gives it
    (minus the negated state of `leaving_groups`; `widened`: as `delta_parts`), with the
    group's old state alongside as
    `__old<column>` (NULL for a new group), as a local relation; None when Arrow cannot
    compute it exactly as Spark does, or the rows are not all held by the driver."""
    import pyarrow as pa

    old_rows = arrow_of(state)
    if old_rows is None:
        return None
    delta_schema = spark.sql(sql.delta_sql(aggregate, changes_view, widened)).schema  # analysed only
    combines = {column: combine for column, _, combine in sql.delta_parts(aggregate, widened)}
    sum_types = {name: delta_schema[name].dataType.simpleString() for name, how in combines.items() if how == "sum"}
    terms = local_arrow(spark.sql(sql.delta_terms_sql(aggregate, changes_view, sum_types, widened)))
    if terms is None:
        return None
    keys = sql.key_columns(aggregate)
    if leaving_groups is not None:
        leaving = local_arrow(leaving_groups)
        if leaving is None or any(how != "sum" for how in combines.values()):
            return None
        terms = pa.concat_tables([terms, _negated(leaving.select(terms.column_names), keys, terms.schema)])
    try:
        combined = combine_terms(terms, keys, combines)
        if combined is None:
            return None
        delta = combined.cast(_arrow_schema(delta_schema))
        touched = delta.join(_old_state(old_rows, keys), keys=keys, join_type="left outer", coalesce_keys=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
        log.info("touched groups folded by Spark: %s", error)
        return None
    schema = _touched_schema(delta_schema, state.schema, keys)
    return local_relation(spark, touched.select(schema.names), schema)


def _negated(rows: pa.Table, keys: list[str], schema: pa.Schema) -> pa.Table:
    """State rows with every value negated (checked), typed as the delta's terms."""
    import pyarrow as pa
    import pyarrow.compute as pc

    columns = [rows[name] if name in keys else pc.negate_checked(rows[name]) for name in rows.column_names]
    return pa.table(columns, names=rows.column_names).cast(schema)


def _combinable(terms: pa.Table, keys: list[str], combines: dict[str, str], null_keys: bool) -> bool:
    """Whether Arrow groups and combines `terms` exactly as Spark would."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for name in keys:
        column = terms[name]
        if (column.null_count and not null_keys) or pa.types.is_floating(column.type):
            return False
    for name, how in combines.items():
        kind = terms[name].type
        if how == "sum":
            if pa.types.is_integer(kind):
                total = pc.sum(pc.abs(terms[name].cast(pa.float64(), safe=False))).as_py() or 0.0
                if total >= _SAFE_INTEGER_TOTAL:
                    return False
            elif pa.types.is_floating(kind):
                finite = pc.filter(terms[name], pc.is_finite(terms[name]))
                if (pc.sum(pc.abs(finite)).as_py() or 0.0) >= _SAFE_FLOAT_TOTAL:
                    return False
            elif not pa.types.is_decimal(kind):
                return False
        elif how == "count_distinct":  # Spark counts NaN once and -0.0 as 0.0; Arrow by bits
            if not _ordered_as_spark(kind):
                return False
        elif not (_ordered_as_spark(kind) or pa.types.is_floating(kind)):
            return False
    return True


def _ordered_as_spark(kind: pa.DataType) -> bool:
    """Whether Arrow compares and tells apart values of `kind` as Spark does."""
    import pyarrow as pa

    return (pa.types.is_integer(kind) or pa.types.is_decimal(kind) or pa.types.is_date(kind)
            or pa.types.is_string(kind) or pa.types.is_boolean(kind) or pa.types.is_timestamp(kind))


def combine_terms(terms: pa.Table, keys: list[str], combines: dict[str, str], *,
                  null_keys: bool = False) -> pa.Table | None:
    """The terms combined per group of `keys` (`combines`: sum, min, max or count_distinct
    per column; a NULL sum or extreme when every term is NULL, and a count of the distinct
    non-NULL values, as in Spark), or None when Arrow would not combine them exactly as
    Spark does (`_combinable`). `null_keys`: a NULL key is a group of its own, as in Spark's
    GROUP BY (refused otherwise, for callers that then join the groups by Arrow, whose
    joins match no NULL)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not _combinable(terms, keys, combines, null_keys):
        return None
    nan_maxima = [name for name, how in combines.items() if how == "max" and pa.types.is_floating(terms[name].type)]
    flags = {f"__nan_{name}": pc.fill_null(pc.is_nan(terms[name]), False) for name in nan_maxima}
    for flag, values in flags.items():
        terms = terms.append_column(flag, values)
    grouped = terms.group_by(keys, use_threads=False).aggregate(
        [*((name, how) for name, how in combines.items()), *((flag, "any") for flag in flags)])
    for name in nan_maxima:  # Spark orders NaN above every number
        column = f"{name}_max"
        nan = pa.scalar(float("nan"), grouped[column].type)
        grouped = grouped.set_column(grouped.schema.get_field_index(column), column,
                                     pc.if_else(grouped[f"__nan_{name}_any"], nan, grouped[column]))
    return grouped.select([*keys, *(f"{name}_{how}" for name, how in combines.items())]).rename_columns(
        [*keys, *combines])


def _old_state(rows: pa.Table, keys: list[str]) -> pa.Table:
    values = [name for name in rows.column_names if name not in keys]
    return rows.select([*keys, *values]).rename_columns([*keys, *(f"{sql.OLD}{name}" for name in values)])


def _arrow_schema(schema: StructType) -> pa.Schema:
    from airflow_backfill.engine.delta.arrow_types import arrow_schema_of

    return arrow_schema_of(schema)


def _touched_schema(delta: StructType, state: StructType, keys: list[str]) -> StructType:
    """The delta's columns, then the old state's values (nullable: a new group has none)."""
    from pyspark.sql.types import StructField, StructType

    old = [StructField(f"{sql.OLD}{field.name}", field.dataType, True) for field in state.fields
           if field.name not in keys]
    return StructType([*delta.fields, *old])
