"""The net stage of a stateless round: the feed netted per upstream key and mapped through
the MV query into keyed MV changes, by the driver or by Spark.

A feed the driver read is netted and mapped with Arrow (`rounds/driver_changes.py`: no
Spark job), its changed keys' MV rows looked up first under a WHERE (they tell which keys
the MV held: `rounds/write.locate_keys`, which the write then reuses); any other feed is
netted and mapped by Spark (`rounds/changes.py`), and its keyed changes held by the driver
when few. Either way the caller gets the same frames, and, from the driver, the changed
keys' old MV rows (a patch's old images).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_backfill.engine.delta.commits import ARRIVED
from airflow_backfill.engine.delta.driver_rows import TableRows, held_in_driver, table_rows_in_driver
from airflow_backfill.engine.delta.log import load_table, spark_schema
from airflow_backfill.engine.rounds.changes import mv_changes, net_changes
from airflow_backfill.engine.rounds.driver_changes import changes_in_driver
from airflow_backfill.engine.rounds.write import locate_keys
from airflow_backfill.engine.sizes import sizes

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from airflow_backfill.engine.delta.keyed_rows import FoundRows
    from airflow_backfill.engine.planning.query import QueryPlan
    from airflow_backfill.engine.rounds.feed import RoundFeed
    from airflow_backfill.job import BackfillJob


@dataclass(frozen=True)
class NettedRound:
    """A stateless round's feed netted per key (`net`, with `__arrived` when rows arrived)
    and mapped to keyed MV changes (`keyed`), with what the driver found on the way."""

    net: DataFrame
    keyed: DataFrame
    located: FoundRows | None = None
    """The MV's rows of the feed's keys (their key columns and where they are)."""
    mv_rows: TableRows | None = None
    """A small MV read whole by the driver, when its rows were not looked up."""
    old_rows: pa.Table | None = None
    """The changed keys' MV rows before the range (the query over their first images)."""
    cached: bool = False

    def release(self) -> None:
        if self.cached:
            self.net.unpersist()


def net_round(spark: SparkSession, job: BackfillJob, plan: QueryPlan, feed: RoundFeed, *,
              key_check: bool) -> NettedRound:
    """Net `feed` and map it to keyed MV changes (see the module's text). `key_check`: the
    round will look the arrived keys up in the upstream, so Spark's netted rows are cached
    for it."""
    refuse = job.verify_primary_key
    arriving = bool(feed.arriving)
    if feed.held is not None:
        # Under a WHERE the MV's own rows tell which changed keys it held: its rows of the
        # feed's keys, looked up (a patch then marks them), else the whole MV when small.
        located = mv_rows = None
        if plan.filters_rows:
            located = mv_rows_of_feed_keys(job, plan, feed.held)
            mv_rows = table_rows_in_driver(spark, job.target) if located is None else None
        held_mv = located.rows if located is not None else mv_rows.rows if mv_rows is not None else None
        in_driver = changes_in_driver(spark, feed.held, feed.frame.schema, plan, refuse_repeated_keys=refuse,
                                      keep_first_image=plan.filters_rows, arrivals=arriving, held_mv=held_mv)
        if in_driver is not None:  # netted and mapped by the driver: no Spark job
            return NettedRound(in_driver.net, in_driver.keyed, located, mv_rows, in_driver.old_rows)
    else:
        located = mv_rows = None
    net = net_changes(feed.frame, plan.upstream_key, refuse_repeated_keys=refuse, keep_first_image=plan.filters_rows)
    cached = False
    if not arriving:  # only departures: a key held once at the watermark is held at most once now
        net = net.drop(ARRIVED)
    elif key_check:
        net, cached = net.cache(), True
    keyed = mv_changes(spark, net, plan)
    change_rows = feed.rows or 0
    if feed.held is not None or change_rows <= sizes().driver_rows:  # few keys (at most one per change row)
        keyed = held_in_driver(keyed, max(change_rows, sizes().driver_rows)) or keyed
    return NettedRound(net, keyed, located, mv_rows, None, cached)


def mv_rows_of_feed_keys(job: BackfillJob, plan: QueryPlan, feed: pa.Table) -> FoundRows | None:
    """The MV's rows of every key the feed changes, found by the driver (`locate_keys`), or
    None when it does not find them (the MV's rows are then read whole, or Spark asked)."""
    table = load_table(job.target)
    names = {name.lower(): name for name in feed.column_names}
    keys = feed.select([names[column.lower()] for column in plan.upstream_key]).rename_columns(list(plan.mv_key))
    keys = keys.group_by(list(plan.mv_key), use_threads=False).aggregate([])
    return locate_keys(job.target, table.version(), spark_schema(table), keys, plan.mv_key, null_safe=True)
