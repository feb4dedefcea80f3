"""The padding term of the delta rule: the parent rows a LEFT JOIN's NULL-supplying table
pads or stops padding in a round.

When table i is the NULL-supplying side of a LEFT JOIN, a parent row padded because i
holds no row at its join key k changes with i: where i's rows at k go from none to some,
the padded rows are retracted (-1); from some to none, they are restored (+1). The count
at k after the change is read from table i as of its new version (only the keys the
change touches), the count before is that minus the change's net at k. The padded rows
are the parent's rows at k, extended along the tree without i's subtree.

A round's change is usually a few keys, and both reads are lookups: i's rows at the
changed keys and the parent's rows at the keys that flip. The driver does them
(`padding_in_driver`: `Reader.lookup`, Arrow's grouping and joins, no Spark job, no Delta
snapshot of either table built in the JVM); Spark does them when the driver cannot
(`padding_by_spark`: changes Spark holds, floating-point join keys, tables the driver
does not read). Both give the same signed rows (tests/test_join_padding.py).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from airflow_backfill.engine.delta.driver_rows import HeldRows, held_rows
from airflow_backfill.engine.joins.relation import Reader, reader, restricted, subtree, walk
from airflow_backfill.engine.planning.aggregate_sql import quote
from airflow_backfill.engine.planning.join_query import JoinPlan, flat_column
from airflow_backfill.engine.rounds.changes import SIGN

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from airflow_backfill.job import BackfillJob

_NET, _NOW = "__net", "__now"


def padding_changes(spark: SparkSession, job: BackfillJob, plan: JoinPlan, index: int, changes: DataFrame,
                    read: Reader, new_version: int, cached: list[DataFrame]) -> DataFrame | None:
    """The padded rows table `index` retracts or restores, signed (`__sign`), as flat rows
    of every table but `index`'s subtree; None when the driver found that none does.
    `changes`: its netted change rows; `read`: the term's reader (tables before `index`
    at their new versions, after it at their old)."""
    parents = padding_in_driver(spark, job, plan, index, changes, read, new_version)
    if parents is None:
        return padding_by_spark(spark, job, plan, index, changes, read, new_version, cached)
    if parents.table.num_rows == 0:
        return None
    table = plan.tables[index]
    assert table.parent is not None
    return walk(plan, table.parent, parents.frame(spark), read, skip=subtree(plan, index), cached=cached)


def padding_by_spark(spark: SparkSession, job: BackfillJob, plan: JoinPlan, index: int, changes: DataFrame,
                     read: Reader, new_version: int, cached: list[DataFrame]) -> DataFrame:
    """`padding_changes` computed by Spark jobs (the counts, the flips, the parents' rows)."""
    from pyspark.sql import functions as F

    table = plan.tables[index]
    parent = table.parent
    assert parent is not None
    own = [flat_column(table.name, c) for _, c in table.on]
    net = (changes.filter(functools.reduce(lambda a, b: a & b, [F.col(quote(c)).isNotNull() for c in own]))
           .groupBy(*(quote(c) for c in own)).agg(F.sum(SIGN).alias(_NET)).cache())
    cached.append(net)
    read_new = reader(spark, job, plan, {table.name: new_version})
    now_rows = restricted(read_new(index), plan, index, [c for _, c in table.on], net, own, semi_join=True,
                          bounded=read_new.skippable(index))
    now = now_rows.groupBy(*(quote(c) for c in own)).agg(F.count(F.lit(1)).alias(_NOW))
    counted = net.join(now, own, "left").select(*(quote(c) for c in own), F.col(_NET),
                                                F.coalesce(F.col(_NOW), F.lit(0)).alias(_NOW))
    before = F.col(_NOW) - F.col(_NET)
    sign = F.when((before == 0) & (F.col(_NOW) > 0), F.lit(-1)).when((before > 0) & (F.col(_NOW) == 0), F.lit(1))
    flips = counted.select(*(quote(c) for c in own), sign.alias(SIGN)).filter(F.col(SIGN).isNotNull()).cache()
    cached.append(flips)
    parent_columns = [flat_column(plan.tables[parent].name, c) for c, _ in table.on]
    parents = restricted(read(parent), plan, parent, [c for c, _ in table.on], flips, own, semi_join=False,
                         bounded=read.skippable(parent))
    signed_parents = parents.join(flips, functools.reduce(
        lambda a, b: a & b, [F.col(quote(p)) == F.col(quote(o)) for p, o in zip(parent_columns, own, strict=True)]
    )).drop(*own)
    return walk(plan, parent, signed_parents, read, skip=subtree(plan, index), cached=cached)


def padding_in_driver(spark: SparkSession, job: BackfillJob, plan: JoinPlan, index: int, changes: DataFrame,
                      read: Reader, new_version: int) -> HeldRows | None:
    """The parent's signed rows of `padding_changes` (its flat columns and `__sign`, before
    the walk along the tree), found by the driver (no rows when nothing flips); None when
    Spark must find them: `changes` not held by the driver, join keys Arrow does not group
    as Spark does (floating point), or a table the driver does not look up."""
    import pyarrow as pa
    import pyarrow.compute as pc

    held = held_rows(changes)
    table = plan.tables[index]
    parent = table.parent
    assert parent is not None
    own = [flat_column(table.name, c) for _, c in table.on]
    keys = None if held is None else held.distinct(own)  # None for floating-point keys
    if held is None or keys is None:
        return None
    present = held.table.filter(functools.reduce(pc.and_, [pc.is_valid(held.table.column(c)) for c in own]))
    net = present.group_by(own, use_threads=False).aggregate([(SIGN, "sum")])
    net = pa.table([*(net.column(c) for c in own), net.column(f"{SIGN}_sum")], names=[*own, _NET])
    net_keys = HeldRows(net.select(own), keys.schema)
    if net.num_rows == 0:
        return net_keys
    now_rows = reader(spark, job, plan, {table.name: new_version}).lookup(index, [c for _, c in table.on], net_keys)
    if now_rows is None:
        return None
    counted = _with_counts(net, now_rows.table, own)
    if counted is None:
        return None
    after = pc.coalesce(counted.column(_NOW), pa.scalar(0, pa.int64()))
    before = pc.subtract(after, counted.column(_NET).cast(pa.int64()))
    retract = pc.and_(pc.equal(before, 0), pc.greater(after, 0))
    restore = pc.and_(pc.greater(before, 0), pc.equal(after, 0))
    sign = pc.if_else(retract, -1, pc.if_else(restore, 1, pa.scalar(None, pa.int64()))).cast(pa.int32())
    flipped = pa.table([*(counted.column(c) for c in own), sign], names=[*own, SIGN]).filter(pc.is_valid(sign))
    if flipped.num_rows == 0:
        return HeldRows(flipped.select(own), keys.schema)
    parents = read.lookup(parent, [c for c, _ in table.on], HeldRows(flipped.select(own), keys.schema))
    if parents is None:
        return None
    signed = parents.join(HeldRows(flipped, _with_sign(keys.schema)),
                          [flat_column(plan.tables[parent].name, c) for c, _ in table.on], own, "inner")
    return None if signed is None else signed.select([*parents.schema.names, SIGN])


def _with_counts(net: pa.Table, rows: pa.Table, own: list[str]) -> pa.Table | None:
    """`net` with the count of `rows` at each of its keys (`__now`, NULL where none), by
    Arrow's grouping and join; None where Arrow cannot match the keys' types."""
    import pyarrow as pa

    counts = rows.group_by(own, use_threads=False).aggregate([([], "count_all")])
    try:
        counts = pa.table([*(counts.column(c).cast(net.schema.field(c).type) for c in own),
                           counts.column("count_all")], names=[*own, _NOW])
        return net.join(counts, keys=own, join_type="left outer")
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def _with_sign(schema: StructType) -> StructType:
    from pyspark.sql.types import IntegerType, StructField, StructType

    return StructType([*schema.fields, StructField(SIGN, IntegerType(), True)])
