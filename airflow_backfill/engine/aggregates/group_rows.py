"""The upstream rows of the groups a MIN, MAX or COUNT(DISTINCT) round recomputes, found
by the driver.

Why: a removed extreme or a removed value of a COUNT(DISTINCT) leaves the group's new value
unknown to the state, so the round recomputes the group from the upstream's rows as of its
end. Spark's time travel reads the whole upstream for that (a snapshot of its log, then
every file), where the driver finds the groups' rows in the files by their key columns
(`keyed_rows`, deletion vectors applied), a cost that follows the groups' rows.

Two ways, the cheaper first:
- `recomputed_in_driver`: when every GROUP BY key and every recomputed argument is a plain
  column and there is no WHERE, the driver reads those columns and folds them itself with
  Arrow (`driver_fold.combine_terms`, only what Arrow computes exactly as Spark does); only
  the groups' new values reach Spark, a row a group. A few groups of a large table are
  most of it: fifty MVs in one shared forward spent 13 - 19 s rounds on such groups read
  by Spark.
- `groups_rows_in_driver`: the groups' rows as a local relation that Spark folds (any WHERE
  or argument expression), up to `sizes.group_rows` rows, since one task then carries them.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from airflow_backfill.engine.aggregates.driver_fold import combine_terms
from airflow_backfill.engine.delta.driver_rows import local_arrow, local_relation
from airflow_backfill.engine.delta.keyed_rows import FoundRows, find_rows
from airflow_backfill.engine.delta.log import spark_schema, table_at
from airflow_backfill.engine.delta.log_state import table_state
from airflow_backfill.engine.planning import aggregate_sql as sql
from airflow_backfill.engine.planning.aggregate_query import COUNT_DISTINCT, MAX, MIN
from airflow_backfill.engine.sizes import sizes

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from airflow_backfill.engine.planning.aggregate_query import AggregateQuery

log = logging.getLogger(__name__)

_COMBINES = {MIN: "min", MAX: "max", COUNT_DISTINCT: "count_distinct"}


def recomputed_in_driver(spark: SparkSession, source: str, aggregate: AggregateQuery, groups: DataFrame,
                         version: int, state: StructType) -> DataFrame | None:
    """The recomputed state columns (`recompute_sql`'s rows: the group keys, then each MIN,
    MAX and COUNT(DISTINCT) column, typed as in `state`) of the `groups` as of `version`,
    folded by the driver from the upstream's rows; None when the query, the types or the
    rows' count (`sizes.recompute_rows`) leave it to Spark."""
    import pyarrow as pa
    from pyspark.sql.types import StructType

    from airflow_backfill.engine.delta.arrow_types import arrow_schema_of

    arguments = sql.plain_argument_columns(aggregate)
    if aggregate.where is not None or arguments is None:
        return None
    parts = sql.recomputed_parts(aggregate)
    found = _found(source, aggregate, groups, version, sorted(set(arguments.values())), sizes().recompute_rows)
    if found is None:
        return None
    rows, named = found
    keys = sql.key_columns(aggregate)
    group_columns = [named[column.lower()] for column in sql.plain_group_columns(aggregate) or []]
    terms = pa.table([*(rows.rows[column] for column in group_columns),
                      *(rows.rows[named[arguments[j].lower()]] for _, _, j in parts)],
                     names=[*keys, *(column for column, _, _ in parts)])
    try:
        combined = combine_terms(terms, keys, {column: _COMBINES[kind] for column, kind, _ in parts}, null_keys=True)
        if combined is None:
            log.info("groups to recompute left to Spark: Arrow would not fold their types as Spark does")
            return None
        schema = StructType([state[name] for name in combined.column_names])
        combined = combined.cast(arrow_schema_of(schema))
    except (TypeError, KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
        log.info("groups to recompute left to Spark: %s", error)
        return None
    log.info("%s groups recomputed by the driver from %s rows in %s files", combined.num_rows, rows.rows.num_rows,
             len(rows.files))
    return local_relation(spark, combined, schema)


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
