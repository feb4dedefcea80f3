"""The keyed MV changes of a small feed the driver holds, worked out in the driver.

Why: over a driver-held feed, `net_changes` and `mv_changes` still plan windows and joins
(most of a round's two thousand py4j calls) and run a Spark job to collect the result:
about 1 s of a one-row round at SF 1. The driver holds the feed's rows already, as Arrow;
netting them per key is a sort (`rounds/netting.py`), and the MV query over the rows that
survive is a projection and a filter over a local relation, which Spark's optimizer
evaluates in the driver without a job; its rows come back as Arrow (`local_arrow`), and
are matched to the changed keys with Arrow (`delta/key_lookup.py`). No value becomes a
Python object on the way, so the process's time zone changes nothing. The results are the
frames `net_changes` and `mv_changes` give (the differential harness compares whole
rounds), as local relations. A query Spark does not evaluate locally, a floating-point or
nested key, or an MV key whose type is not the upstream key's returns None, and the
caller takes Spark's way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from airflow_backfill.engine.delta.change_feed import FEED_COLUMNS
from airflow_backfill.engine.delta.commits import ARRIVED, PRESENT, REPEATED_KEY
from airflow_backfill.engine.delta.driver_rows import is_local, local_arrow, local_relation
from airflow_backfill.engine.delta.key_lookup import comparable_key, contains, matching_rows
from airflow_backfill.engine.planning.query import QueryPlan
from airflow_backfill.engine.rounds.changes import BEFORE, DELETED, HELD_BEFORE, apply_query
from airflow_backfill.engine.rounds.netting import RepeatedKey, net_feed
from airflow_backfill.exceptions import BackfillError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType


class RepeatedKeyInFeed(BackfillError):
    """A key the feed shows held twice, with the message Spark's netting fails with."""


@dataclass(frozen=True)
class DriverChanges:
    """The two frames a stateless round builds from its feed, worked out by the driver."""

    net: DataFrame
    """As `net_changes` gives it, as a local relation."""
    keyed: DataFrame
    """As `mv_changes` gives it, as a local relation."""
    old_rows: pa.Table | None = None
    """The MV's rows of the changed keys before the range: the query over each key's row
    before it (the MV is exact at its watermark, so these are its rows); what a patch's
    change file holds as old images, without reading them from the MV's files."""


def changes_in_driver(
    spark: SparkSession, feed: pa.Table, schema: StructType, plan: QueryPlan, *, refuse_repeated_keys: bool,
    keep_first_image: bool, arrivals: bool, held_mv: pa.Table | None = None,
) -> DriverChanges | None:
    """The netted feed and the keyed MV changes of `feed` (rows of `schema`: upstream
    columns, `_change_type` and `_commit_version`), or None when the driver cannot work
    them out as Spark would (see the module's text). Without `arrivals` the frames carry
    no `__arrived`, as the caller drops it then. Raises `RepeatedKeyInFeed` for a key the
    feed shows held twice (under `refuse_repeated_keys`). `held_mv`: the MV's rows at the
    range's start, when the driver read them: which changed keys the MV held is then looked
    up in them, where it otherwise takes the query over the keys' rows before the range
    (the MV is exact there, so both give the same keys)."""
    from pyspark.sql.types import BooleanType, StructField, StructType

    upstream = StructType([field for field in schema.fields if field.name not in FEED_COLUMNS])
    if not all(comparable_key(feed.schema.field(key).type) for key in plan.upstream_key):
        return None
    netted = net_feed(feed, plan.upstream_key, refuse_repeated_keys=refuse_repeated_keys)
    if isinstance(netted, RepeatedKey):
        raise RepeatedKeyInFeed(REPEATED_KEY + netted.describe())
    flagged = refuse_repeated_keys and arrivals
    net_fields = [*upstream.fields, StructField(DELETED, BooleanType())]
    if flagged:
        net_fields.append(StructField(ARRIVED, BooleanType()))
    if keep_first_image:
        net_fields += [StructField(BEFORE, upstream), StructField(HELD_BEFORE, BooleanType())]
    net_schema = StructType(net_fields)
    net = local_relation(spark, netted.select(net_schema.names), net_schema)
    live = local_relation(spark, netted.filter(pc.invert(netted.column(DELETED))).select(upstream.names), upstream)
    if net is None or live is None:
        return None
    new = _query_rows(spark, live, plan, upstream)
    if new is None:
        return None
    new_rows, new_schema = new
    keys = netted.select(list(plan.upstream_key)).rename_columns(list(plan.mv_key))
    try:
        found = matching_rows(keys, plan.mv_key, new_rows, plan.mv_key)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    present = pc.is_valid(found)
    kept = present
    if flagged:
        kept = pc.or_(kept, netted.column(ARRIVED))
    before = _rows_before(spark, netted, plan, upstream)
    if keep_first_image:
        held = _keys_of(held_mv, keys, plan) if held_mv is not None else None
        if held is None and before is not None:
            held = before.select(list(plan.mv_key))
        if held is None:
            return None
        try:
            kept = pc.or_(kept, contains(keys, plan.mv_key, held, plan.mv_key))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
    else:
        kept = pa.array([True] * netted.num_rows, pa.bool_())
    keyed_rows = _keyed_rows(keys, new_rows, found, present, netted, plan, flagged).filter(kept)
    key_fields = {mv: upstream[name] for name, mv in zip(plan.upstream_key, plan.mv_key, strict=True)}
    keyed_schema = StructType([
        StructField(field.name, key_fields[field.name].dataType, key_fields[field.name].nullable)
        if field.name in key_fields else StructField(field.name, field.dataType, True)
        for field in new_schema.fields
    ] + [StructField(PRESENT, BooleanType())] + ([StructField(ARRIVED, BooleanType())] if flagged else []))
    keyed = local_relation(spark, keyed_rows.select(keyed_schema.names), keyed_schema)
    return None if keyed is None else DriverChanges(net, keyed, before)


def _keyed_rows(keys: pa.Table, new_rows: pa.Table, found: pa.Array, present: pa.Array, netted: pa.Table,
                plan: QueryPlan, flagged: bool) -> pa.Table:
    """One row per netted key: the key, the MV row the query gave it (NULLs when none),
    `__present` (true, or NULL for a key that leaves the MV) and, when `flagged`,
    `__arrived`."""
    values = new_rows.take(found)
    columns = {name: keys.column(name) if name in plan.mv_key else values.column(name)
               for name in new_rows.column_names}
    columns[PRESENT] = pc.if_else(present, pa.scalar(True), pa.scalar(None, pa.bool_()))
    if flagged:
        columns[ARRIVED] = netted.column(ARRIVED)
    return pa.table(columns)


def _keys_of(mv: pa.Table, keys: pa.Table, plan: QueryPlan) -> pa.Table | None:
    """The MV's key columns named as `plan.mv_key`, or None when the MV spells a key in
    another type than `keys` has it (then the query over the rows before decides)."""
    names = {name.lower(): name for name in mv.column_names}
    spelled = [names.get(key.lower()) for key in plan.mv_key]
    if None in spelled or any(mv.schema.field(name).type != keys.schema.field(key).type
                              for name, key in zip(spelled, plan.mv_key, strict=True)):
        return None
    return mv.select(spelled).rename_columns(list(plan.mv_key))


def _rows_before(spark: SparkSession, netted: pa.Table, plan: QueryPlan, upstream: StructType) -> pa.Table | None:
    """The MV rows the rows before the range gave (the query over each key's row before
    it, for the keys that had one)."""
    if BEFORE not in netted.column_names:
        return None
    earlier = netted.filter(netted.column(HELD_BEFORE)).column(BEFORE).combine_chunks()
    rows = pa.Table.from_struct_array(earlier) if len(earlier) else pa.table(
        {field.name: pa.array([], field.type) for field in earlier.type})
    before = local_relation(spark, rows.select(upstream.names), upstream)
    result = None if before is None else _query_rows(spark, before, plan, upstream)
    return None if result is None else result[0]


def _query_rows(spark: SparkSession, rows: DataFrame, plan: QueryPlan,
                upstream: StructType) -> tuple[pa.Table, StructType] | None:
    """The MV query's rows over `rows` as Arrow, when Spark evaluates it in the driver and
    it keeps the upstream key's values and types under the MV key's names."""
    result = apply_query(spark, rows, plan.query)
    if not is_local(result):
        return None
    for name, mv in zip(plan.upstream_key, plan.mv_key, strict=True):
        if mv not in result.schema.names or result.schema[mv].dataType != upstream[name].dataType:
            return None
    table = local_arrow(result)
    return None if table is None else (table, result.schema)
