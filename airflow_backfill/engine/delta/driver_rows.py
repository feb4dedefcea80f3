"""Small intermediate results held by the driver as Spark local relations.

Why: every Spark action over a computed or cached DataFrame costs a job and the driver's
planning around it (0.1 - 0.3 s each on two cores), however few its rows. A round's last
steps ask several such questions of the same few rows: is some group's count negative,
what is the changes' key range, which rows does each table keep. Once those rows are a
local relation, Spark's optimizer keeps filters and projections over it local and
answers collects without a job, so the questions cost driver time only.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from airflow_backfill.engine.delta.listed_files import scala_items

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

DRIVER_ROWS = 10_000
"""The most rows a round holds in the driver (a few MB for the narrow rows of an
aggregate's touched groups); larger results stay where Spark computed them."""


def held_in_driver(frame: DataFrame, limit: int | None = None) -> DataFrame | None:
    """`frame`'s rows as a local relation of the same schema (one job to collect them), or
    None when it has more than `limit` (default `DRIVER_ROWS`) rows, or when Spark cannot
    hold them locally (Arrow cannot carry a column type, or the rows exceed
    `spark.sql.execution.arrow.localRelationThreshold`)."""
    table = arrow_rows(frame, limit)
    return None if table is None else local_relation(frame.sparkSession, table, frame.schema)


def arrow_rows(frame: DataFrame, limit: int | None = None) -> pa.Table | None:
    """`frame`'s rows collected as Arrow (one job), or None when there are more than
    `limit` (default `DRIVER_ROWS`) or Arrow cannot carry a column type."""
    from pyspark.errors import PySparkException
    from pyspark.sql.pandas.types import to_arrow_schema

    limit = DRIVER_ROWS if limit is None else limit
    try:
        to_arrow_schema(frame.schema, error_on_duplicated_field_names_in_struct=True,
                        timezone=frame.sparkSession.conf.get("spark.sql.session.timeZone"))
    except (PySparkException, TypeError) as error:
        log.info("rows kept in Spark: Arrow cannot carry their types (%s)", error)
        return None
    table = frame.limit(limit + 1).toArrow()  # errors of computing the rows reach the caller
    return None if table.num_rows > limit else table


def local_relation(spark: SparkSession, table: pa.Table, schema: StructType) -> DataFrame | None:
    """Arrow rows as a Spark local relation of `schema`; None when Spark would not hold
    them locally (beyond `spark.sql.execution.arrow.localRelationThreshold`)."""
    local = spark.createDataFrame(table, schema=schema)
    return local if is_local(local) else None


def is_local(frame: DataFrame) -> bool:
    """Whether Spark answers `frame` from rows the driver holds (its optimized plan is a
    local relation), so that collecting it runs no job.

    A plan that reads anything else (a table, a cached frame) is refused from its leaves
    before it is optimized: optimizing a scan of a Delta table plans the scan, whose file
    skipping and deletion-vector lookups are Spark jobs (0.5 s for a join round's changes
    at TPC-H SF 1), and that optimized plan is not the one the frame later runs."""
    execution = frame._jdf.queryExecution()
    leaves = scala_items(execution.analyzed().collectLeaves())
    if any(leaf.getClass().getSimpleName() not in _LOCAL_LEAVES for leaf in leaves):
        return False
    return execution.optimizedPlan().getClass().getSimpleName() == "LocalRelation"


_LOCAL_LEAVES = frozenset({"LocalRelation", "OneRowRelation"})
"""Leaves of plans Spark's optimizer may fold into one local relation."""
