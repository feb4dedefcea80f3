"""Turn a range of the upstream's change feed into keyed changes of the MV.

Pure functions of DataFrames: they never touch the Delta logs, so they are tested with
small in-memory data and reused by both catch-up and forward. Spark runs them on the
executors; nothing here brings rows to the driver.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from airflow_backfill.engine.delta.change_feed import (
    ARRIVING,
    CHANGE_TYPE,
    COMMIT_VERSION,
    FEED_COLUMNS,
    LEAVING,
)
from airflow_backfill.engine.delta.commits import ARRIVED, PRESENT, repeated_key_error
from airflow_backfill.engine.planning.query import SOURCE_TABLE, QueryPlan

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession, WindowSpec

DELETED = "__deleted"
BEFORE = "__before"
"""The key's row before the range (a struct of the upstream columns), under `keep_first_image`."""
HELD_BEFORE = "__held_before"
"""Whether the key had a row before the range (its earliest change took one out)."""
_EARLIEST = "__earliest"

# Within one commit a key can appear more than once (a rewrite removes and re-adds it);
# the image that survives the commit is the highest-ranked one.
CHANGE_RANK = {"update_preimage": 0, "delete": 1, "insert": 2, "update_postimage": 3}

SIGN = "__sign"


def net_changes(
    changes: DataFrame, upstream_key: tuple[str, ...], *, refuse_repeated_keys: bool = True,
    keep_first_image: bool = False,
) -> DataFrame:
    """The last image of every upstream key changed in the feed, flagged when deleted.

    Output: the upstream's columns plus `__deleted` (true when the key no longer exists
    at the end of the range, including a key moved away by an update of the key) and,
    with `refuse_repeated_keys`, `__arrived` (the key's rows grew by one over the range).

    Netting keeps one image per key, which is only right when the key is unique. With
    `refuse_repeated_keys`, a key whose feed shows it held twice at some epoch (its rows
    counted up and down change by change span more than one, as when two rows with the
    key arrive together) makes Spark raise an error starting with `REPEATED_KEY` when the
    rows are evaluated, so the commit never happens. The counts are window functions over
    the netting's own partitioning and order: no extra shuffle or sort, but the netting
    then reads every change row (without them Spark keeps only each key's latest row in a
    map-side top-1 before its shuffle). A second row arriving for a key that was there
    before the range does not show in the feed: the MERGE refuses it (`__arrived` on a
    key the MV holds), or the key check (`rounds/key_check.py`) when the query may have filtered the first row out.

    With `keep_first_image`, each key also carries the row it had before the range
    (`__before`, a struct of the upstream columns; `__held_before` tells whether it had
    one): the earliest change row when that is a pre-image or a delete. A query with a
    WHERE needs it to tell a key that leaves the MV from one the MV never held.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    rank = F.lit(None).cast("int")
    for change_type, value in CHANGE_RANK.items():
        rank = F.when(F.col(CHANGE_TYPE) == change_type, F.lit(value)).otherwise(rank)
    latest_first = Window.partitionBy(*upstream_key).orderBy(F.col(COMMIT_VERSION).desc(), F.col("__rank").desc())
    upstream_columns = [c for c in changes.columns if c not in FEED_COLUMNS]
    deleted = F.col(CHANGE_TYPE).isin("delete", "update_preimage")
    ranked = changes.withColumn("__rank", rank)
    if refuse_repeated_keys:
        netted = _flag_repeated_keys(ranked, latest_first)
        deleted = F.when(F.col("__repeated"), repeated_key_error(upstream_key)).otherwise(deleted)
        flags = [deleted.alias(DELETED), (F.col("__total") == 1).alias(ARRIVED)]
    else:
        netted = ranked.withColumn("__n", F.row_number().over(latest_first))
        flags = [deleted.alias(DELETED)]
    if keep_first_image:
        # Same partitioning and order as the netting: no other shuffle or sort. Read newest
        # first, the last row of the key's whole frame is its earliest change.
        whole_key = latest_first.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
        earliest = F.last(F.struct(*(F.col(f"`{c}`") for c in upstream_columns), F.col(CHANGE_TYPE))).over(whole_key)
        netted = netted.withColumn(_EARLIEST, earliest)
        flags += [F.col(_EARLIEST).dropFields(CHANGE_TYPE).alias(BEFORE),
                  F.col(f"{_EARLIEST}.{CHANGE_TYPE}").isin(*LEAVING).alias(HELD_BEFORE)]
    return netted.filter(F.col("__n") == 1).select(*upstream_columns, *flags)


def _flag_repeated_keys(ranked: DataFrame, latest_first: WindowSpec) -> DataFrame:
    """Add the netting's `__n` and `__repeated`: the key's row count, followed change by
    change, spans more than one.

    With a unique key the upstream holds 0 or 1 row of it at every epoch, so the running
    sum of arrivals (+1) and departures (-1) stays within a span of one whatever the count
    was before the range. Read backwards in the netting's order, a commit's departures
    come before its arrivals, so a unique key stays within that span between the rows of
    one commit too. `__after` sums a row and the rows that came later; the total minus it
    is the running sum just before the row. Same window order as the netting: two window
    operators over one sort.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    whole_key = latest_first.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    after = F.sum(_sign()).over(latest_first.rowsBetween(Window.unboundedPreceding, Window.currentRow))
    counted = ranked.select("*", F.row_number().over(latest_first).alias("__n"),
                            F.sum(_sign()).over(whole_key).alias("__total"), after.alias("__after"))
    before = F.col("__total") - F.col("__after")
    spanned = counted.select(
        "*", F.max(before).over(whole_key).alias("__high"), F.min(before).over(whole_key).alias("__low"))
    high = F.greatest(F.col("__high"), F.col("__total"))
    low = F.least(F.col("__low"), F.col("__total"))
    return spanned.withColumn("__repeated", high - low > 1)


def count_changes(feed: DataFrame) -> tuple[int, int]:
    """(change rows, those that bring a row in: inserts and post-images), in one job."""
    from pyspark.sql import functions as F

    row = feed.agg(F.count(F.lit(1)), F.count(F.when(F.col(CHANGE_TYPE).isin(*ARRIVING), 1))).first()
    return (int(row[0]), int(row[1])) if row is not None else (0, 0)


def some_key_gained_rows(feed: DataFrame, key: Sequence[str]) -> bool:
    """True when the range leaves some key with more upstream rows than it found (the
    signs of the key's change rows sum above zero). When every key was held at most once
    before the range, only such a key can be held twice after it. One shuffle of the
    change rows' key columns; the first key found ends the job."""
    from pyspark.sql import functions as F

    gained = signed_rows(feed, key).groupBy(*(F.col(f"`{c}`") for c in key)).agg(F.sum(SIGN).alias(SIGN))
    return bool(gained.filter(F.col(SIGN) > 0).limit(1).collect())


def signed_rows(feed: DataFrame, columns: Sequence[str]) -> DataFrame:
    """Every change row as an upstream row (only `columns`) with `__sign`: +1 when it
    arrives, -1 when it leaves.

    Inserts and post-images add their row, deletes and pre-images remove theirs. Summed
    per group this is exactly what a range of epochs does to an aggregate, with no
    netting per key (a key rewritten in one commit removes and re-adds its row).
    """
    from pyspark.sql import functions as F

    return feed.select(*(F.col(f"`{c}`") for c in columns), _sign().alias(SIGN)).where(f"`{SIGN}` IS NOT NULL")


def _in(values: Sequence[str]) -> str:
    return ", ".join(f"'{value}'" for value in values)


_SIGN_SQL = f"CASE WHEN `{CHANGE_TYPE}` IN ({_in(ARRIVING)}) THEN 1 WHEN `{CHANGE_TYPE}` IN ({_in(LEAVING)}) THEN -1 END"


def _sign() -> Column:
    """+1 for a change row that brings its row in, -1 for one that takes it out. Written
    as SQL: two or three JVM calls, where building it from Column functions takes 37 (a
    round of an aggregate builds it once or twice)."""
    from pyspark.sql import functions as F

    return F.expr(_SIGN_SQL)


def apply_query(spark: SparkSession, rows: DataFrame, query: str) -> DataFrame:
    """The MV query evaluated over `rows` bound as the table `source`."""
    rows.createOrReplaceTempView(SOURCE_TABLE)
    return spark.sql(query)


def duplicate_key(rows: DataFrame, key: Sequence[str]) -> tuple[dict, int] | None:
    """One key that `rows` holds more than once, with its count; None when the key is unique.

    A count over a window partitioned by the key (one shuffle, then a sort) is about twice
    as fast as a GROUP BY on keys that are nearly all distinct: partial aggregation cannot
    shrink them, so its hash maps only cost memory.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    copies = F.count(F.lit(1)).over(Window.partitionBy(*key)).alias("__copies")
    found = rows.select(*key, copies).filter(F.col("__copies") > 1).limit(1).collect()
    if not found:
        return None
    values = found[0].asDict()
    return values, int(values.pop("__copies"))


def mv_changes(spark: SparkSession, net: DataFrame, plan: QueryPlan) -> DataFrame:
    """Keyed MV changes: one row per changed MV key with the new row, or `__present` null
    (and `__arrived` when `net` has it).

    A stateless query maps each live upstream row to at most one MV row with the same
    key; keys whose new image is deleted or filtered out leave the MV (when `net` carries
    each key's row before the range, only those the MV held). Keys are matched NULL-safely:
    an upstream that is itself an aggregate MV may have a NULL group key.
    """
    from pyspark.sql import functions as F

    flags = [column for column in (ARRIVED,) if column in net.columns]
    images = [column for column in (BEFORE, HELD_BEFORE) if column in net.columns]
    live = net.filter(~F.col(DELETED)).drop(DELETED, *flags, *images)
    new_rows = apply_query(spark, live, plan.query).withColumn(PRESENT, F.lit(True)).alias("n")
    changed_keys = net.select(
        *(F.col(upstream).alias(mv) for upstream, mv in zip(plan.upstream_key, plan.mv_key, strict=True)), *flags
    ).distinct().alias("k")
    same_key = [F.col(f"k.`{key}`").eqNullSafe(F.col(f"n.`{key}`")) for key in plan.mv_key]
    keyed = changed_keys.join(new_rows, on=same_key, how="left").select(
        *(F.col(f"k.`{column}`" if column in plan.mv_key else f"n.`{column}`").alias(column)
          for column in new_rows.columns),
        *(F.col(f"k.{flag}") for flag in flags),
    )
    if not images:
        return keyed
    return _without_keys_never_held(spark, keyed, net, plan)


def _without_keys_never_held(spark: SparkSession, keyed: DataFrame, net: DataFrame, plan: QueryPlan) -> DataFrame:
    """`keyed` without the departures of keys the MV held neither before nor after the range.

    Under a WHERE, a key whose new image is filtered out or deleted leaves the MV only if
    its row before the range passed the query: an update of a row the query leaves out
    (or a row inserted and deleted within the range) changes nothing in the MV. Dropping
    those keys keeps a round of updates made of new rows only, which a replace writes
    without Delta's MERGE. Keys that arrived stay, so that counting the arrivals in the
    keyed changes counts them all (the round's key checks start from that count).
    """
    from pyspark.sql import functions as F

    before = net.filter(F.col(HELD_BEFORE)).select(f"{BEFORE}.*")
    held = apply_query(spark, before, plan.query).select(
        *(F.col(f"`{key}`") for key in plan.mv_key)).withColumn(HELD_BEFORE, F.lit(True)).alias("h")
    same_key = [F.col(f"c.`{key}`").eqNullSafe(F.col(f"h.`{key}`")) for key in plan.mv_key]
    kept_when = F.col(f"c.{PRESENT}").isNotNull() | F.col(f"h.{HELD_BEFORE}").isNotNull()
    if ARRIVED in keyed.columns:
        kept_when = kept_when | F.col(f"c.{ARRIVED}")
    kept = keyed.alias("c").join(held, on=same_key, how="left").filter(kept_when)
    return kept.select(*(F.col(f"c.`{column}`").alias(column) for column in keyed.columns))
