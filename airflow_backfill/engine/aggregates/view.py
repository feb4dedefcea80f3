"""From an aggregate's state to the MV's rows, and from two sets of MV rows to MV changes.

The MV of an aggregate is a pure function of its state (live groups passing HAVING,
projected as the query says), so snapshot, rounds and crash recovery all produce MV
rows the same way, here.
"""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING

from airflow_backfill.engine.planning import aggregate_sql
from airflow_backfill.engine.planning.aggregate_query import AggregateQuery
from airflow_backfill.engine.rounds.difference import keyed_difference
from airflow_backfill.exceptions import UnsupportedQueryError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

STATE_VIEW = "__airflow_backfill_state"


def analyse(spark: SparkSession, upstream: StructType, sql: str) -> StructType:
    """The schema Spark derives for `sql` over `source` with the upstream's schema (no data read)."""
    from pyspark.errors import AnalysisException

    spark.createDataFrame([], upstream).createOrReplaceTempView("source")
    try:
        return spark.sql(sql).schema
    except AnalysisException as error:
        raise UnsupportedQueryError(
            f"Spark cannot analyse the aggregate over the upstream ({error}); check the argument "
            "types of the aggregates (e.g. SUM of a string column) against the upstream's schema."
        ) from None


def value_types(spark: SparkSession, aggregate: AggregateQuery, upstream: StructType) -> list[str]:
    """The Spark SQL type of each aggregate call's result, as Spark types it in the query."""
    if not aggregate.calls:
        return []
    ansi = spark.conf.get("spark.sql.ansi.enabled")
    return list(_probed_types(spark, aggregate_sql.probe_sql(aggregate), upstream.json(), ansi))


@functools.lru_cache(maxsize=64)
def _probed_types(spark: SparkSession, probe: str, upstream: str, ansi: str | None) -> tuple[str, ...]:
    """Cached per session, query, upstream schema and ANSI mode (which decide the types):
    every round of a job asks the same."""
    from pyspark.sql.types import StructType

    schema = StructType.fromJson(json.loads(upstream))
    return tuple(field.dataType.simpleString() for field in analyse(spark, schema, probe).fields)


def cast_to(frame: DataFrame, schema: StructType, keep: tuple[str, ...] = ()) -> DataFrame:
    """`frame`'s columns named by `schema`, cast to its types, then the `keep` columns as they are."""
    columns = [(field.name, field.dataType.simpleString()) for field in schema.fields]
    return frame.selectExpr(*aggregate_sql.cast_expressions(columns, keep))


def visible_rows(
    spark: SparkSession, aggregate: AggregateQuery, state: DataFrame, types: list[str], mv: StructType
) -> DataFrame:
    """The MV rows of the groups in `state`, with the MV's column names and types."""
    state.createOrReplaceTempView(STATE_VIEW)
    names = [field.name for field in mv.fields]
    mv_types = [field.dataType.simpleString() for field in mv.fields]
    return spark.sql(aggregate_sql.visible_sql(aggregate, STATE_VIEW, types, names, mv_types))


def mv_changes(old_rows: DataFrame, new_rows: DataFrame, key: tuple[str, ...]) -> DataFrame:
    """Keyed MV changes turning `old_rows` into `new_rows` (one full outer join on the key,
    rows compared exactly: `rounds/difference.keyed_difference`): new or changed rows with
    `__present` true, keys only in `old_rows` with `__present` null.

    Used where old and new rows come from different places (crash recovery: the MV as
    committed vs the rows the state gives); a round derives its changes per group instead.
    """
    return keyed_difference(old_rows, new_rows, key)
