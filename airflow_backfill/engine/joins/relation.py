"""Read a join's upstreams as of given versions and walk its join tree from one table.

A round never joins whole upstreams: it starts from a small relation (one upstream's
changes, or a snapshot chunk) and joins the neighbouring tables one edge at a time, each
read only where the rows so far fall. A round's rows are few: the driver looks the
neighbour's rows up at their keys (`Reader.lookup`) and joins them with Arrow; where it
cannot, Spark reads them with a literal range on the joined column (Delta skips the files
whose statistics lie outside it) and, for a round, a semi-join with the values
themselves. Walking away from the root follows each join's own kind (INNER or
LEFT); walking towards the root is an INNER join, since the rows being extended already
hold the child's row, which only the parent rows it matched can carry.

Rows are flat: each upstream column is named `<upstream>__<column>` (`flat_column`), so
the relation the walk builds is the `source` of the planned flat query.
"""

from __future__ import annotations

import functools
import logging
import operator
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_backfill.engine.delta.driver_lookup import lookup_rows
from airflow_backfill.engine.delta.driver_rows import (
    HeldRows,
    arrow_rows,
    distinct_rows,
    held_rows,
    is_local,
    local_arrow,
    local_join,
    select_columns,
)
from airflow_backfill.engine.delta.key_range import boundable, within_bounds
from airflow_backfill.engine.delta.log import load_table, spark_schema, table_at
from airflow_backfill.engine.planning.aggregate_sql import quote
from airflow_backfill.engine.planning.join_query import INNER, JoinPlan, flat_column
from airflow_backfill.engine.sizes import sizes

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from airflow_backfill.job import BackfillJob

log = logging.getLogger(__name__)


def upstream_uri(job: BackfillJob, name: str) -> str:
    return next(upstream.table for upstream in job.upstreams if upstream.name == name)


class Reader:
    """Reads each upstream as of its version in `versions` (Delta time travel, lazy): table
    index -> that upstream's rows, with its own column names."""

    def __init__(self, spark: SparkSession, job: BackfillJob, plan: JoinPlan, versions: Mapping[str, int]) -> None:
        self._spark, self._job, self._plan, self._versions = spark, job, plan, dict(versions)
        self._read: dict[int, DataFrame] = {}
        self._schemas: dict[int, StructType] = {}

    def __call__(self, index: int) -> DataFrame:
        if index not in self._read:
            name = self._plan.tables[index].name
            self._read[index] = self._kept(index, self._spark.read.format("delta")
                                           .option("versionAsOf", self._versions[name]).load(upstream_uri(self._job, name)))
        return self._read[index]

    def schema(self, index: int) -> StructType:
        """Table `index`'s Spark schema at its version, from its Delta log (no Spark read)."""
        if index not in self._schemas:
            name = self._plan.tables[index].name
            self._schemas[index] = spark_schema(table_at(upstream_uri(self._job, name), self._versions[name]))
        return self._schemas[index]

    def _kept(self, index: int, rows: DataFrame) -> DataFrame:
        """The rows of table `index` a round reads of those it holds (all of them)."""
        return rows

    def _kept_held(self, index: int, rows: HeldRows) -> HeldRows | None:
        """`_kept` of rows the driver holds; None when Spark must tell them."""
        return rows

    def lookup(self, index: int, columns: list[str], keys: HeldRows) -> HeldRows | None:
        """Table `index` (flat) where its `columns` equal a row of `keys` (in the same
        order), read by the driver (`driver_lookup`: no Delta scan planned, no Spark job);
        None when the driver does not read it (too many keys or rows, deletion vectors)."""
        table = self._plan.tables[index]
        found = lookup_rows(upstream_uri(self._job, table.name), self._versions[table.name], table.columns, columns,
                            keys.table)
        kept = None if found is None else self._kept_held(index, HeldRows(*found))
        if kept is None:
            log.info("rows of %s at the round's keys left to Spark", table.name)
            return None
        return kept.select(list(table.columns), self._plan.flat_columns(index))

    def skippable(self, index: int) -> bool:
        """Whether bounds on its join column could skip files: the upstream has several
        (its latest version's count, from the log; one file is read whole anyway)."""
        return len(load_table(upstream_uri(self._job, self._plan.tables[index].name)).file_uris()) > 1


def reader(spark: SparkSession, job: BackfillJob, plan: JoinPlan, versions: Mapping[str, int]) -> Reader:
    """Reads each upstream as of its version in `versions`."""
    return Reader(spark, job, plan, versions)


def flat_rows(rows: DataFrame, plan: JoinPlan, index: int) -> DataFrame:
    """The columns of table `index` a round needs, named flat."""
    from pyspark.sql import functions as F

    table = plan.tables[index]
    return rows.select(*(F.col(quote(c)).alias(flat_column(table.name, c)) for c in table.columns))


def flat_schema(plan: JoinPlan, schemas: Mapping[str, StructType]) -> StructType:
    """The flat relation's schema from the upstreams' schemas (by name)."""
    from pyspark.sql.types import StructField, StructType

    fields = []
    for table in plan.tables:
        types = {field.name: field.dataType for field in schemas[table.name].fields}
        fields += [StructField(flat_column(table.name, c), types[c], True) for c in table.columns]
    return StructType(fields)


def restricted(rows: DataFrame, plan: JoinPlan, index: int, columns: list[str], keys: DataFrame,
               key_columns: list[str], *, semi_join: bool, bounded: bool = True,
               known: tuple[Any, Any] | None = None) -> DataFrame:
    """Table `index` (flat) where its `columns` equal some row of `keys` (`key_columns`, in
    the same order): bounded by the range of the first key column when its type bounds
    exactly (and `bounded`; `known`: that range, or a wider one, already read), then
    semi-joined with the keys when `semi_join`."""
    from pyspark.sql import functions as F

    renamed = [f"__key{i}" for i in range(len(key_columns))]  # the keys may be this table's own columns
    keys = keys.select(*(F.col(quote(k)).alias(r) for k, r in zip(key_columns, renamed, strict=True)))
    first = next(f for f in rows.schema.fields if f.name == columns[0])
    if bounded and boundable(first.dataType):
        if known is None:
            bounds = keys.agg(F.min(F.col(renamed[0])), F.max(F.col(renamed[0]))).first()
            known = (None, None) if bounds is None else (bounds[0], bounds[1])
        low, high = known
        column = F.col(quote(first.name))
        if low is None:
            rows = rows.filter(F.lit(False))
        else:
            rows = rows.filter(within_bounds(column, low, high, first.dataType))
    flat = flat_rows(rows, plan, index)
    if not semi_join:
        return flat
    name = plan.tables[index].name
    # The keys are a round's (few): broadcast, the table's rows are filtered where they are
    # read. Left to adaptive execution, both sides would be shuffled before it notices.
    return flat.join(F.broadcast(keys), _equal([flat_column(name, c) for c in columns], renamed), "left_semi")


def walk(plan: JoinPlan, start: int, rows: DataFrame, read: Reader, *, skip: frozenset[int] = frozenset(),
         semi_join: bool = True, bounded: bool = True, cached: list[DataFrame] | None = None,
         start_bounds: Mapping[str, tuple[Any, Any]] | None = None) -> DataFrame:
    """`rows` (flat columns of table `start`, plus any carried columns) joined with every
    other table except `skip`, along the tree. The columns of `skip` are NULL (rows in
    which those tables are padded). Intermediate results are cached into `cached` (each
    is read twice: for the next table's bounds and for its join), unless the driver holds
    them: a round's few rows and the rows the driver looked up for them (`Reader.lookup`)
    are joined by the driver as Arrow (`HeldRows`), with no Spark job, and handed to
    Spark as one local relation at the end. Without `semi_join` (a
    snapshot chunk, large and not cached) only the tables next to `start` get bounds:
    bounds further out would recompute the joins so far. Without `bounded` none do (rows
    that span every key would pay a scan for bounds that skip nothing). `start_bounds`:
    ranges of `start`'s columns (`first_hop_columns`) known to hold `rows`' values, so the
    tables next to `start` are bounded without a job of their own."""
    current, included, queue = rows, {start}, [start]
    held = held_rows(rows) if semi_join else None  # rows the driver holds stay Arrow until Spark needs them
    while queue:
        here = queue.pop(0)
        for there in plan.neighbours(here):
            if there in included or there in skip:
                continue
            kind, pairs = edge(plan, here, there)
            here_columns, there_columns = edge_columns(plan, here, there)
            how = "inner" if kind == INNER else "left"
            included.add(there)
            queue.append(there)
            columns = [c for _, c in pairs]
            found, looked_up = None, False
            if held is not None:  # keys, lookup and join in Arrow
                keys_held = held.distinct(here_columns)
                if keys_held is not None:
                    found, looked_up = read.lookup(there, columns, keys_held), True
                joined = None if found is None else held.join(found, here_columns, there_columns, how)
                if joined is not None:
                    held = joined
                    continue
                current, held = held.frame(rows.sparkSession), None
            if cached is not None and not is_local(current):
                current = current.cache()
                cached.append(current)
            keys = distinct_rows(current, here_columns) if semi_join \
                else current.select(*(quote(c) for c in here_columns))
            if semi_join and not looked_up:
                found = _lookup_keys(read, there, columns, keys, here_columns)
            if found is not None:
                other = found.frame(rows.sparkSession)
            else:
                known = (start_bounds or {}).get(here_columns[0]) if here == start else None
                other = restricted(read(there), plan, there, columns, keys, here_columns, semi_join=semi_join,
                                   bounded=bounded and (semi_join or here == start) and read.skippable(there),
                                   known=known)
            joined_frame = local_join(current, other, here_columns, there_columns, how) if semi_join else None
            current = joined_frame if joined_frame is not None else current.join(
                other, _equal(here_columns, there_columns), how)
    if held is not None:
        current = held.frame(rows.sparkSession)
    return with_padded(current, plan, skip, read)


def chunk_joined(plan: JoinPlan, start: int, rows: DataFrame, read: Reader, *, bounded: bool) -> DataFrame:
    """A snapshot chunk's `rows` (flat columns of table `start`, the largest upstream)
    joined with every other table. When every join is INNER (any order gives the same
    rows), each of `start`'s neighbours is first joined with the tables beyond it, and
    the chunk's many rows meet the result last, as in the plan of a query that names the
    large table last (Spark does not reorder joins): TPC-H Q3's orders meet the customers
    of one segment before the line items (docs/benchmarks.md). With a LEFT join the order
    is the query's own (`walk`). The neighbours are bounded by the chunk's range of their
    join column when `bounded`."""
    if any(table.padded for table in plan.tables):
        return walk(plan, start, rows, read, semi_join=False, bounded=bounded)
    current = rows
    for there in plan.neighbours(start):
        _, pairs = edge(plan, start, there)
        here_columns, there_columns = edge_columns(plan, start, there)
        near = restricted(read(there), plan, there, [c for _, c in pairs], rows.select(*(quote(c) for c in here_columns)),
                          here_columns, semi_join=False, bounded=bounded and read.skippable(there))
        current = current.join(_branch(plan, start, there, near, read), _equal(here_columns, there_columns), "inner")
    return with_padded(current, plan, frozenset(), read)


def _branch(plan: JoinPlan, came_from: int, here: int, rows: DataFrame, read: Reader) -> DataFrame:
    """`rows` of table `here` (flat) INNER-joined with every table beyond it, away from
    `came_from`."""
    for there in plan.neighbours(here):
        if there == came_from:
            continue
        beyond = _branch(plan, here, there, flat_rows(read(there), plan, there), read)
        rows = rows.join(beyond, _equal(*edge_columns(plan, here, there)), "inner")
    return rows


def _lookup_keys(read: Reader, there: int, columns: list[str], keys: DataFrame,
                 key_columns: list[str]) -> HeldRows | None:
    """`Reader.lookup` at keys Spark computed: collected first (one job), unless there are
    more than `sizes.lookup_keys` of them."""
    selected = select_columns(keys, key_columns)
    collected = local_arrow(selected)
    if collected is None:
        collected = arrow_rows(selected, sizes().lookup_keys)
    return None if collected is None else read.lookup(there, columns, HeldRows(collected, selected.schema))


def first_hop_columns(plan: JoinPlan, start: int) -> list[str]:
    """The flat columns of table `start` whose ranges bound its neighbours' reads in `walk`
    (the first column of each edge)."""
    columns = []
    for there in plan.neighbours(start):
        _, pairs = edge(plan, start, there)
        column = flat_column(plan.tables[start].name, pairs[0][0])
        if column not in columns:
            columns.append(column)
    return columns


def with_padded(rows: DataFrame, plan: JoinPlan, tables: frozenset[int], read: Reader) -> DataFrame:
    """`rows` with NULL columns for `tables`, then every flat column in table order and
    the carried columns last (so the terms of a round union by position and name)."""
    from pyspark.sql import functions as F

    for index in sorted(tables):
        types = {field.name: field.dataType for field in read.schema(index).fields}
        table = plan.tables[index]
        rows = rows.select("*", *(F.lit(None).cast(types[c]).alias(flat_column(table.name, c)) for c in table.columns))
    ordered = [c for i in range(len(plan.tables)) for c in plan.flat_columns(i)]
    carried = [c for c in rows.columns if c not in set(ordered)]
    return rows.selectExpr(*(quote(c) for c in [*ordered, *carried]))  # a select of names: 2 - 3 JVM calls each


def subtree(plan: JoinPlan, index: int) -> frozenset[int]:
    """Table `index` and every table joined below it."""
    found = {index}
    for child in plan.children(index):
        found |= subtree(plan, child)
    return frozenset(found)


def edge(plan: JoinPlan, here: int, there: int) -> tuple[str, list[tuple[str, str]]]:
    """(join kind, [(column of `here`, column of `there`)]) of the edge between the two
    neighbours."""
    if plan.tables[there].parent == here:
        table = plan.tables[there]
        return table.kind or INNER, [(parent, own) for parent, own in table.on]
    return INNER, [(own, parent) for parent, own in plan.tables[here].on]


def edge_columns(plan: JoinPlan, here: int, there: int) -> tuple[list[str], list[str]]:
    """The flat columns of `here` and of `there` that the edge between them equates, pair
    by pair."""
    _, pairs = edge(plan, here, there)
    return ([flat_column(plan.tables[here].name, c) for c, _ in pairs],
            [flat_column(plan.tables[there].name, c) for _, c in pairs])


def _equal(left: list[str], right: list[str]) -> Column:
    from pyspark.sql import functions as F

    return functools.reduce(operator.and_, [F.col(quote(a)) == F.col(quote(b)) for a, b in zip(left, right, strict=True)])
