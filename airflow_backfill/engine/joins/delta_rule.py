"""The delta rule of a join: a round's change feeds as signed rows of the join.

Between the vectors `old` and `new`, the join's change telescopes over its tables in
FROM order: J(new) - J(old) is the sum over tables i of the change when only table i
moves from old_i to new_i while the tables before it are read at their new versions and
the tables after it at their old ones. So each term reads one upstream's change feed.

For table i with signed changes dT (+1 arriving rows, -1 leaving rows, netted per row):

- every join is linear in the rows of its preserved side, so the term's rows are dT
  joined with the other tables along the tree (`relation.walk`): for two tables R, S that
  is dR x S@s_old + R@r_new x dS, and each other table is read only where the changed
  join keys fall;
- when table i is the NULL-supplying side of a LEFT JOIN, a parent row that is padded
  because i has no match at its join key k changes too: retracted where i's rows at k go
  from none to some, restored where they go from some to none (`padding`).

Summed, the terms are exactly the multiset change of the join's rows; WHERE and the
projection (or an aggregate's per-group sums) are linear, so they apply to signed rows
unchanged. See docs/joins.md for the proof and tests/test_joins.py for the checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_backfill.engine.delta.change_feed import ARRIVING, CHANGE_TYPE, LEAVING, read_change_feed
from airflow_backfill.engine.delta.driver_feed import HeldFeed, feed_in_driver
from airflow_backfill.engine.delta.driver_rows import (
    held_in_driver,
    local_relation,
    one_nan,
    row_count,
    union_rows,
)
from airflow_backfill.engine.joins.padding import padding_changes
from airflow_backfill.engine.joins.relation import flat_schema, reader, upstream_uri, walk
from airflow_backfill.engine.planning.aggregate_sql import quote
from airflow_backfill.engine.planning.join_query import LEFT, JoinPlan
from airflow_backfill.engine.rounds.changes import SIGN, signed_rows
from airflow_backfill.engine.rounds.exact_values import grouped_rows
from airflow_backfill.engine.sizes import sizes

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from airflow_backfill.job import BackfillJob

@dataclass
class JoinChanges:
    """A round's signed join rows and what they were made from."""

    rows: DataFrame
    """Flat columns of every table plus `__sign` (lazy)."""
    change_rows: int
    """Netted change rows of the upstreams (what the round applied, for the rate limit)."""
    cached: list[DataFrame]
    """Cached intermediates, to unpersist once the round committed."""
    leaving: DataFrame | None = None
    """A stateless MV's rows that leave, already mapped through the query, with `__sign`
    -1 (`leave_arrive`); None when every change is in `rows`."""
    leaving_groups: DataFrame | None = None
    """An aggregate's state rows of the groups that leave whole (`leave_arrive`)."""

    def unpersist(self) -> None:
        for frame in self.cached:
            frame.unpersist()


def join_changes(spark: SparkSession, job: BackfillJob, plan: JoinPlan, old: Mapping[str, int],
                 new: Mapping[str, int]) -> JoinChanges:
    """The signed rows by which the join's result at `new` differs from that at `old`."""
    cached: list[DataFrame] = []
    terms: list[DataFrame] = []
    change_rows = 0
    try:
        for index, table in enumerate(plan.tables):
            if new[table.name] == old[table.name]:
                continue
            versions = {t.name: (new if j < index else old)[t.name] for j, t in enumerate(plan.tables)}
            read = reader(spark, job, plan, versions)
            changes = netted_changes(spark, job, plan, index, old[table.name], new[table.name])
            cached.append(changes)
            change_rows += row_count(changes)
            terms.append(walk(plan, index, changes, read, cached=cached))
            padded = None if table.kind != LEFT else \
                padding_changes(spark, job, plan, index, changes, read, new[table.name], cached)
            if padded is not None:
                terms.append(padded)
    except BaseException:
        for frame in cached:
            frame.unpersist()
        raise
    # Read once, by the aggregate's fold or the stateless round's held keyed changes: not cached.
    rows = union_rows(terms) if terms else no_rows(spark, job, plan, new)
    return JoinChanges(rows, change_rows, cached)


def netted_changes(spark: SparkSession, job: BackfillJob, plan: JoinPlan, index: int, old: int,
                    new: int) -> DataFrame:
    """Table `index`'s change rows over (old, new] as flat rows with `__sign`, netted per
    whole row: a row that left and came back, or an update of columns the query does not
    read, cancels out before anything is joined. A feed the driver read is netted by the
    driver into a local relation (the walks then join it there too), any other is cached
    by the caller's count."""
    from pyspark.sql import functions as F

    table = plan.tables[index]
    uri = upstream_uri(job, table.name)
    held = feed_in_driver(spark, uri, old, new, list(table.columns), limit=sizes().join_feed_rows)
    columns = plan.flat_columns(index)
    local = None if held is None else _netted_in_driver(spark, held, list(table.columns), columns)
    if local is not None:  # Spark's plan below is not even built (a few hundred py4j calls)
        return local
    feed = held.frame if held is not None else read_change_feed(spark, uri, old, new, list(table.columns))
    signed = signed_rows(feed, list(table.columns)).select(
        *(F.col(quote(c)).alias(f) for c, f in zip(table.columns, columns, strict=True)), SIGN)
    netted = grouped_rows(signed, columns, {SIGN: F.sum(SIGN).cast("int")}).filter(F.col(SIGN) != 0)
    local = None if held is None else held_in_driver(netted, sizes().join_feed_rows)
    return local if local is not None else netted.cache()


def _netted_in_driver(spark: SparkSession, held: HeldFeed, own: list[str], flat: list[str]) -> DataFrame | None:
    """The held feed's rows signed and netted per whole row by Arrow, as a local relation
    with the same rows as Spark's netting (no job); None for types Arrow does not group
    (nested ones). Arrow groups a float by its bits, as the netting's `grouped_rows` does
    (-0.0 apart from 0.0) once every NaN is the one NaN (`one_nan`)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyspark.sql.types import IntegerType, StructField, StructType

    rows = held.table
    kinds = rows.column(CHANGE_TYPE)
    sign = pc.if_else(pc.is_in(kinds, pa.array(ARRIVING)), 1,
                      pc.if_else(pc.is_in(kinds, pa.array(LEAVING)), -1, pa.scalar(None, pa.int64())))
    signed = pa.table([*(one_nan(rows.column(c)) for c in own), sign], names=[*flat, SIGN]).filter(pc.is_valid(sign))
    try:
        summed = signed.group_by(flat, use_threads=False).aggregate([(SIGN, "sum")])
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    netted = summed.filter(pc.not_equal(summed.column(f"{SIGN}_sum"), 0))
    types = {field.name: field.dataType for field in held.frame.schema.fields}
    schema = StructType([*(StructField(f, types[c], True) for c, f in zip(own, flat, strict=True)),
                         StructField(SIGN, IntegerType(), True)])
    return local_relation(spark, pa.table([*(netted.column(c) for c in flat), netted.column(f"{SIGN}_sum").cast(
        pa.int32())], names=schema.names), schema)


def no_rows(spark: SparkSession, job: BackfillJob, plan: JoinPlan, versions: Mapping[str, int]) -> DataFrame:
    """An empty relation with the flat columns and `__sign` (no upstream moved)."""
    from pyspark.sql.types import IntegerType

    read = reader(spark, job, plan, versions)
    schema = flat_schema(plan, {table.name: read.schema(i) for i, table in enumerate(plan.tables)})
    return spark.createDataFrame([], schema.add(SIGN, IntegerType()))
