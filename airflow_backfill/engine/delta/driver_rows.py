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
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_backfill.engine.delta.arrow_types import arrow_schema_of
from airflow_backfill.engine.delta.listed_files import listed_rows
from airflow_backfill.engine.delta.log import load_table, spark_schema
from airflow_backfill.engine.internals import (
    analyzed_plan,
    arrow_as_frame,
    arrow_local_relation_threshold,
    deferred_local_relation,
    is_deferred,
    leaf_kinds,
    local_relation_rows,
    local_rows_as_arrow,
    optimized_plan,
    plan_kind,
)
from airflow_backfill.engine.planning.aggregate_sql import quote
from airflow_backfill.engine.sizes import sizes

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

def held_in_driver(frame: DataFrame, limit: int | None = None) -> DataFrame | None:
    """`frame`'s rows as a local relation of the same schema (a job collects them), or
    None when it has more than `limit` (default `sizes.driver_rows`) rows, or when Spark cannot
    hold them locally (Arrow cannot carry a column type, or the rows exceed
    `spark.sql.execution.arrow.localRelationThreshold`). Rows Spark computes from a local
    relation (a projection of it) are collected without a job."""
    table = local_arrow(frame)
    if table is not None:
        limit = sizes().driver_rows if limit is None else limit
        return None if table.num_rows > limit else local_relation(frame.sparkSession, table, frame.schema)
    table = arrow_rows(frame, limit)
    return None if table is None else local_relation(frame.sparkSession, table, frame.schema)


def held_whole(uri: str) -> bool:
    """Whether the driver may hold the table at `uri` whole: at most `sizes.held_table_rows` rows
    in at most `sizes.held_table_bytes` of files, counted from its log."""
    import pyarrow as pa
    import pyarrow.compute as pc

    actions = pa.table(load_table(uri).get_add_actions(flatten=True))
    if not actions.num_rows:
        return True
    rows = pc.sum(pc.fill_null(actions.column("num_records"), sizes().held_table_rows + 1)).as_py() \
        if "num_records" in actions.column_names else sizes().held_table_rows + 1
    return bool(rows <= sizes().held_table_rows and pc.sum(actions.column("size_bytes")).as_py() <= sizes().held_table_bytes)


@dataclass(frozen=True)
class TableRows:
    """A small table's rows the driver read, with the version and columns they are of."""

    version: int
    rows: pa.Table
    schema: StructType


def table_rows_in_driver(spark: SparkSession, uri: str) -> TableRows | None:
    """The latest version of a small table (`held_whole`) as Arrow, read by the driver from
    its listed files (columns and types as its log gives them); None for a larger table, or
    one the driver does not read (`listed_rows`)."""
    if not held_whole(uri):
        return None
    table = load_table(uri)
    schema = spark_schema(table)
    rows = listed_rows(spark, uri, table.version(), schema)
    return None if rows is None else TableRows(table.version(), rows, schema)


def held_table(spark: SparkSession, uri: str) -> DataFrame | None:
    """`table_rows_in_driver` as a local relation."""
    held = table_rows_in_driver(spark, uri)
    return None if held is None else local_relation(spark, held.rows, held.schema)


def held_or_cached(frame: DataFrame, limit: int | None = None) -> DataFrame:
    """`frame`'s rows as a local relation when there are at most `limit` (default
    `sizes.driver_rows`), else `frame` cached: either way its rows are computed once (a collect
    that found too many would otherwise be computed again by the next action)."""
    cached = frame.persist()
    try:
        held = held_in_driver(cached, limit)
    except BaseException:
        cached.unpersist()
        raise
    if held is None:
        return cached
    cached.unpersist()
    return held


def arrow_rows(frame: DataFrame, limit: int | None = None) -> pa.Table | None:
    """`frame`'s rows collected as Arrow (one job), or None when there are more than
    `limit` (default `sizes.driver_rows`) or Arrow cannot carry a column type."""
    from pyspark.errors import PySparkException

    limit = sizes().driver_rows if limit is None else limit
    try:
        arrow_schema_of(frame.schema)
    except (PySparkException, TypeError) as error:
        log.info("rows kept in Spark: Arrow cannot carry their types (%s)", error)
        return None
    table = frame.limit(limit + 1).toArrow()  # errors of computing the rows reach the caller
    return None if table.num_rows > limit else table


def local_relation(spark: SparkSession, table: pa.Table, schema: StructType) -> DataFrame | None:
    """Arrow rows as a Spark local relation of `schema`; None when Spark would not hold
    them locally (beyond `spark.sql.execution.arrow.localRelationThreshold`).

    Rows of at most `sizes.deferred_bytes` are handed to the JVM only when Spark first needs
    them (`internals.deferred_local_relation`): most of a round's local relations
    are read back as Arrow by the next step and never reach Spark."""
    if table.column_names == schema.names and table.nbytes <= _deferred_limit(spark):
        deferred = deferred_local_relation(spark, table, schema)
        _ARROW_OF[deferred] = table
        return deferred
    local = arrow_as_frame(spark, table, schema)
    # Spark made a local relation of the rows, or a scan of them beyond its threshold; no
    # need to optimize the plan to tell (optimizing a projection over many rows copies them)
    if plan_kind(analyzed_plan(local)) != "LocalRelation":
        return None
    if table.column_names == schema.names:
        _ARROW_OF[local] = table
    return local


def _deferred_limit(spark: SparkSession) -> int:
    return min(sizes().deferred_bytes, arrow_local_relation_threshold(spark) // 2)


_ARROW_OF: weakref.WeakKeyDictionary[DataFrame, pa.Table] = weakref.WeakKeyDictionary()
"""The Arrow rows each local relation `local_relation` made was made from: `local_arrow`
takes them back without collecting them through Spark."""


def is_local(frame: DataFrame) -> bool:
    """Whether Spark answers `frame` from rows the driver holds (its optimized plan is a
    local relation), so that collecting it runs no job.

    A plan that reads anything else (a table, a cached frame) is refused from its leaves
    before it is optimized: optimizing a scan of a Delta table plans the scan, whose file
    skipping and deletion-vector lookups are Spark jobs (0.5 s for a join round's changes
    at TPC-H SF 1), and that optimized plan is not the one the frame later runs."""
    if is_deferred(frame):  # not in the JVM yet
        return True
    return _local_leaves(frame) and plan_kind(optimized_plan(frame)) == "LocalRelation"


def _local_leaves(frame: DataFrame) -> bool:
    """Whether every leaf of `frame`'s analysed plan is one the optimizer may fold into a
    local relation."""
    return all(kind in _LOCAL_LEAVES for kind in leaf_kinds(analyzed_plan(frame)))


_LOCAL_LEAVES = frozenset({"LocalRelation", "OneRowRelation"})
"""Leaves of plans Spark's optimizer may fold into one local relation."""


_ARROW_JOINS = {"inner": "inner", "left": "left outer", "left_anti": "left anti", "left_semi": "left semi"}
"""Spark's join kinds and Arrow's names for them (both: NULL never equals)."""


def arrow_of(frame: DataFrame) -> pa.Table | None:
    """The Arrow rows `frame` was made from by `local_relation` (None for any other frame)."""
    return _ARROW_OF.get(frame)


def select_columns(frame: DataFrame, columns: list[str], names: list[str] | None = None) -> DataFrame:
    """`frame`'s `columns`, renamed to `names`: taken from the Arrow rows `frame` was made
    from when the driver holds them (the result is such a local relation too, so the next
    step needs no collect), else Spark's select."""
    from pyspark.sql import functions as F

    names = list(columns) if names is None else list(names)
    rows = arrow_of(frame)
    if rows is not None:
        local = HeldRows(rows, frame.schema).select(columns, names).local_frame(frame.sparkSession)
        if local is not None:
            return local
    return frame.select(*(F.col(quote(c)).alias(n) for c, n in zip(columns, names, strict=True)))


def local_arrow(frame: DataFrame) -> pa.Table | None:
    """The rows of a local relation as Arrow, without a Spark job: the rows it was made
    from (`local_relation`), or Spark's own conversion of its rows in the JVM
    (`internals.local_rows_as_arrow`), so no value passes through a Python object. None
    when `frame` is not local, or Arrow cannot carry a column type."""
    import pyarrow as pa
    from py4j.protocol import Py4JJavaError

    made = arrow_of(frame)
    if made is not None:
        return made
    if not is_deferred(frame) and not _local_leaves(frame):
        return None
    try:  # None when the optimized plan is not a local relation
        return local_rows_as_arrow(frame)
    except (Py4JJavaError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
        log.info("rows kept in Spark: %s", error)
        return None


def local_join(left: DataFrame, right: DataFrame, left_columns: list[str], right_columns: list[str],
               how: str) -> DataFrame | None:
    """`left` joined with `right` where each of `left_columns` equals its `right_columns`
    (`how`: inner, left, left_anti or left_semi), computed by the driver with Arrow when
    both are local relations of few rows (`HeldRows.join`): the result is a local relation
    again, so a chain of such joins runs no Spark job. None when Spark must join them."""
    left_rows = held_rows(left)
    right_rows = None if left_rows is None else held_rows(right)
    joined = None if left_rows is None or right_rows is None else left_rows.join(
        right_rows, left_columns, right_columns, how)
    return None if joined is None else joined.local_frame(left.sparkSession)


def union_rows(frames: list[DataFrame]) -> DataFrame:
    """`frames` (the same columns, in the same order, of the same types) one after the
    other, as Spark's `unionByName` gives them: concatenated by Arrow into one local
    relation when the driver holds every one (Spark's optimizer does not fold a union of
    local relations into one, so every step after it would run a job), else Spark's union."""
    import pyarrow as pa
    from pyspark.sql.types import StructField, StructType

    first = frames[0]
    local = None
    if all([(f.name, f.dataType) for f in frame.schema.fields] == [(f.name, f.dataType) for f in first.schema.fields]
           for frame in frames):
        held = [held_rows(frame) for frame in frames]
        if all(rows is not None for rows in held):
            tables = [rows.table for rows in held if rows is not None]
            target = pa.schema([field.with_nullable(True) for field in tables[0].schema])
            try:
                combined = pa.concat_tables([table.cast(target) for table in tables])
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
                log.info("union left to Spark: %s", error)
            else:
                schema = StructType([StructField(f.name, f.dataType, any(frame.schema[i].nullable for frame in frames))
                                     for i, f in enumerate(first.schema.fields)])
                local = local_relation(first.sparkSession, combined, schema)
    if local is not None:
        return local
    union = first
    for frame in frames[1:]:
        union = union.unionByName(frame)
    return union


def held_rows(frame: DataFrame) -> HeldRows | None:
    """`frame`'s rows as `HeldRows` when it is a local relation Arrow can carry
    (`local_arrow`), without a job; else None."""
    rows = local_arrow(frame)
    return None if rows is None else HeldRows(rows, frame.schema)


@dataclass(frozen=True)
class HeldRows:
    """Rows the driver holds as Arrow, with the Spark schema they stand for.

    Why: each Spark local relation made of Arrow rows costs the JVM a conversion of every
    row and a py4j round trip, however few steps later Spark reads it. Steps that only
    select, deduplicate and join rows the driver holds (a join walk's hops) stay Arrow
    here; `frame` hands the result to Spark once."""

    table: pa.Table
    schema: StructType

    def select(self, columns: list[str], names: list[str] | None = None) -> HeldRows:
        from pyspark.sql.types import StructField, StructType

        names = list(columns) if names is None else list(names)
        fields = {field.name: field for field in self.schema.fields}
        return HeldRows(self.table.select(columns).rename_columns(names), StructType([
            StructField(n, fields[c].dataType, fields[c].nullable) for c, n in zip(columns, names, strict=True)]))

    def distinct(self, columns: list[str]) -> HeldRows | None:
        """The distinct rows of `columns`; None for floating-point columns (Spark groups NaN
        and -0.0 otherwise)."""
        selected = self.select(columns)
        if any(_floating(field.type) for field in selected.table.schema):
            return None
        unique = selected.table.group_by(columns, use_threads=False).aggregate([]).select(columns)
        return HeldRows(unique, selected.schema)

    def join(self, other: HeldRows, left_columns: list[str], right_columns: list[str], how: str) -> HeldRows | None:
        """These rows joined with `other` as Spark joins them (`how`: inner, left, left_anti
        or left_semi; NULL never equals), by Arrow's hash join; None when Spark must join
        them (overlapping column names, more than `sizes.driver_join_rows` rows, a type
        Arrow does not join, floating-point keys: Arrow matches them by their bits, Spark
        takes -0.0 for 0.0)."""
        import pyarrow as pa
        from pyspark.sql.types import StructField, StructType

        keeps_right = how in ("inner", "left")
        if keeps_right and set(self.schema.names) & set(other.schema.names):
            return None
        if any(_floating(self.table.schema.field(c).type) for c in left_columns) or \
                any(_floating(other.table.schema.field(c).type) for c in right_columns):
            return None
        if self.table.num_rows + other.table.num_rows > sizes().driver_join_rows:
            return None
        right = other.table
        try:
            right = right.cast(pa.schema([
                field.with_type(self.table.schema.field(left_columns[right_columns.index(field.name)]).type)
                if field.name in right_columns else field for field in right.schema]))
            joined = self.table.join(right, keys=left_columns, right_keys=right_columns, join_type=_ARROW_JOINS[how],
                                     coalesce_keys=False)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
            log.info("join left to Spark: %s", error)
            return None
        if not keeps_right:
            return HeldRows(joined.select(self.schema.names), self.schema)
        padded = how == "left"
        schema = StructType([*self.schema.fields, *(StructField(f.name, f.dataType, f.nullable or padded)
                                                    for f in other.schema.fields)])
        return HeldRows(joined.select(schema.names), schema)

    def local_frame(self, spark: SparkSession) -> DataFrame | None:
        """The rows as a Spark local relation (`local_relation`); None when Spark would not
        hold them locally."""
        return local_relation(spark, self.table, self.schema)

    def frame(self, spark: SparkSession) -> DataFrame:
        """The rows as a Spark DataFrame: a local relation, or Spark's scan of them when
        they are beyond its threshold."""
        local = self.local_frame(spark)
        return local if local is not None else arrow_as_frame(spark, self.table, self.schema)


def distinct_rows(frame: DataFrame, columns: list[str], names: list[str] | None = None) -> DataFrame:
    """The distinct rows of `frame`'s `columns` (renamed to `names`): a local relation
    computed by the driver when `frame` is local (Spark's distinct of it would be a job),
    else Spark's distinct."""
    names = list(columns) if names is None else list(names)
    rows = held_rows(frame)
    unique = None if rows is None else rows.select(columns, names).distinct(names)
    local = None if unique is None else unique.local_frame(frame.sparkSession)
    return select_columns(frame, columns, names).distinct() if local is None else local


def row_count(frame: DataFrame) -> int:
    """`frame`'s rows: counted by the driver when it is local, else by a Spark job."""
    return local_relation_rows(frame) if is_local(frame) else frame.count()


def one_nan(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A floating-point column with every NaN made the one NaN Spark writes (other columns
    as they are). Why: Arrow groups and joins floats by their bits, where Spark takes every
    NaN as one value; with one NaN, Arrow's grouping is the exact grouping of
    `exact_values.grouping_value` (NaN with NaN, -0.0 apart from 0.0)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not _floating(column.type):
        return column
    return pc.if_else(pc.is_nan(column), pa.scalar(float("nan"), column.type), column)


def _floating(data_type: pa.DataType) -> bool:
    import pyarrow as pa

    return pa.types.is_floating(data_type)
