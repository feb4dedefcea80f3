"""The groups a MIN, MAX or COUNT(DISTINCT) round recomputes, from the upstream's rows the
driver finds.

Why: a removed extreme or a removed value of a COUNT(DISTINCT) leaves the group's new value
unknown to the state, so the round recomputes the group from the upstream's rows as of its
end. Spark's time travel reads the whole upstream for that (a snapshot of its log, then
every file), where the driver finds the groups' rows in the files by their GROUP BY
columns (`keyed_rows`, deletion vectors applied), a cost that follows the groups' rows.

The cheapest way that applies, in order:
- the GROUP BY keys and the recomputed arguments are plain columns and there is no WHERE:
  the driver reads those columns of up to `sizes.recompute_rows` rows and folds them with
  Arrow (`driver_fold.combine_terms`, only what Arrow computes exactly as Spark does);
  only the groups' values reach Spark, a row a group. A few groups of a large table are
  most of it: fifty MVs in one shared forward spent 13 - 19 s rounds on such groups read
  by Spark;
- otherwise (a WHERE, an argument expression, a type Arrow does not fold as Spark does)
  Spark folds up to `sizes.group_rows` of the rows as a local relation (one task carries
  them all), or else reads the upstream as of the version. Evaluating such rows with
  Spark's optimizer (no job) and folding them with Arrow was measured and left out: the
  forward's rounds took 1.5x longer (fifty MVs, 20 k and 200 k rows an upstream).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from airflow_backfill.engine.aggregates.driver_fold import combine_terms
from airflow_backfill.engine.delta.change_feed import read_upstream_as_of
from airflow_backfill.engine.delta.driver_rows import local_arrow, local_relation
from airflow_backfill.engine.delta.keyed_rows import FoundRows, find_rows
from airflow_backfill.engine.delta.log import spark_schema, table_at
from airflow_backfill.engine.delta.log_state import table_state
from airflow_backfill.engine.planning import aggregate_sql as sql
from airflow_backfill.engine.planning.aggregate_query import COUNT_DISTINCT, MAX, MIN
from airflow_backfill.engine.sizes import sizes

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from airflow_backfill.engine.planning.aggregate_query import AggregateQuery

log = logging.getLogger(__name__)

_COMBINES = {MIN: "min", MAX: "max", COUNT_DISTINCT: "count_distinct"}


def recomputed_groups(spark: SparkSession, source: str, aggregate: AggregateQuery, groups_view: str,
                      version: int, state: StructType) -> DataFrame:
    """`recompute_sql`'s rows (the group keys, then each MIN, MAX and COUNT(DISTINCT) state
    column, typed as in `state`) of the groups in `groups_view` as of `version`, the
    cheapest way that applies (see the module's text): a local relation when the driver
    folded them."""
    groups = spark.table(groups_view)
    arguments = sql.plain_argument_columns(aggregate)
    if aggregate.where is None and arguments is not None:
        folded = _folded(spark, aggregate, _plain_terms(source, aggregate, groups, version, arguments), state)
        if folded is not None:
            return folded
    rows = groups_rows_in_driver(spark, source, aggregate, groups, version)
    (rows if rows is not None else read_upstream_as_of(spark, source, version)).createOrReplaceTempView("source")
    return spark.sql(sql.recompute_sql(aggregate, groups_view))


def _folded(spark: SparkSession, aggregate: AggregateQuery, terms: pa.Table | None,
            state: StructType) -> DataFrame | None:
    """`terms` (`row_sql`'s rows of the groups) folded per group by Arrow, as a local
    relation typed as in `state`; None when there are none or Arrow would not fold them
    exactly as Spark does."""
    import pyarrow as pa
    from pyspark.sql.types import StructType

    from airflow_backfill.engine.delta.arrow_types import arrow_schema_of

    if terms is None:
        return None
    parts = sql.recomputed_parts(aggregate)
    keys = sql.key_columns(aggregate)
    try:
        combined = combine_terms(
            pa.table([*(terms[key] for key in keys), *(terms[f"__x{j}"] for _, _, j in parts)],
                     names=[*keys, *(column for column, _, _ in parts)]),
            keys, {column: _COMBINES[kind] for column, kind, _ in parts}, null_keys=True)
        if combined is None:
            log.info("groups to recompute folded by Spark: Arrow would not fold their types as Spark does")
            return None
        schema = StructType([state[name] for name in combined.column_names])
        combined = combined.cast(arrow_schema_of(schema))
    except (TypeError, KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
        log.info("groups to recompute folded by Spark: %s", error)
        return None
    log.info("%s groups recomputed by the driver from %s upstream rows", combined.num_rows, terms.num_rows)
    return local_relation(spark, combined, schema)


def _plain_terms(source: str, aggregate: AggregateQuery, groups: DataFrame, version: int,
                 arguments: dict[int, str]) -> pa.Table | None:
    """The groups' rows as `row_sql` would give them (`__g<i>`, `__x<j>`), read by the driver
    from the plain columns they are; None when it does not find them."""
    import pyarrow as pa

    found = _found(source, aggregate, groups, version, sorted(set(arguments.values())), sizes().recompute_rows)
    if found is None:
        return None
    rows, named = found
    group_columns = [named[column.lower()] for column in sql.plain_group_columns(aggregate) or []]
    return pa.table([*(rows.rows[column] for column in group_columns),
                     *(rows.rows[named[column.lower()]] for column in arguments.values())],
                    names=[*sql.key_columns(aggregate), *(f"__x{j}" for j in arguments)])


def groups_rows_in_driver(spark: SparkSession, source: str, aggregate: AggregateQuery, groups: DataFrame,
                          version: int) -> DataFrame | None:
    """The upstream's rows (as of `version`) of the `groups` a round must recompute, as a
    local relation of the columns the query reads; None when the driver does not find
    them (the caller reads the upstream) or they are more than `sizes.group_rows`."""
    import pyarrow as pa
    from pyspark.sql.types import StructType

    from airflow_backfill.engine.delta.arrow_types import arrow_schema_of

    schema = spark_schema(table_at(source, version))
    wanted = [name for name in schema.names if name.lower() in sql.row_columns(aggregate)]
    found = _found(source, aggregate, groups, version, wanted, sizes().group_rows)
    if found is None:
        return None
    rows = found[0]
    subset = StructType([schema[name] for name in wanted])
    try:
        held = rows.rows.select(wanted).cast(arrow_schema_of(subset))
    except (TypeError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
        log.info("groups to recompute read by Spark: %s", error)
        return None
    log.info("%s rows of groups to recompute read by the driver from %s files", held.num_rows, len(rows.files))
    return local_relation(spark, held, subset)


def _found(source: str, aggregate: AggregateQuery, groups: DataFrame, version: int, columns: list[str],
           most_rows: int) -> tuple[FoundRows, dict[str, str]] | None:
    """The upstream's rows of `groups` with `columns` (as the query or the table spells
    them), and the table's spelling of each lower-cased column name; None when a GROUP BY
    key is no plain column, the driver does not hold the groups or does not find their
    rows, or they are more than `most_rows`."""
    group_columns = sql.plain_group_columns(aggregate)
    keys = None if group_columns is None else local_arrow(groups)
    state = None if keys is None else table_state(source, version)
    if group_columns is None or keys is None or state is None:
        return None
    named = {name.lower(): name for name in spark_schema(table_at(source, version)).names}
    if any(column.lower() not in named for column in [*group_columns, *columns]):
        return None
    in_table = [named[column.lower()] for column in group_columns]
    found = find_rows(state, in_table, keys.select(sql.key_columns(aggregate)).rename_columns(in_table),
                      [named[column.lower()] for column in columns], null_safe=True, most_rows=most_rows)
    return None if found is None else (found, named)
