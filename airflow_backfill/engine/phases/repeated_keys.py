"""Refuse a stateless round over an upstream whose key turned out held twice, before it commits.

Netting (`changes.net_changes`) and the MERGE keep one row per key, so a repeated key
would leave the MV wrong without a word. Each path of a round has a check that costs
what the round already reads: appended files are checked on their own, the change
feed's netting counts each key's rows, and the MERGE refuses a second row for a key the
MV holds. One case escapes them all: a query with a WHERE leaves some upstream rows out
of the MV, and a second row arriving for such a key shows as a plain insert in the feed
with no MV row to match. For those queries the upstream itself, as of the round's end,
is asked about the keys the round inserted, or appended below the upstream's largest
earlier key (file statistics tell, without reading data).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from airflow_backfill.engine.delta.change_feed import CHANGE_TYPE
from airflow_backfill.engine.delta.key_range import KeyRange, boundable
from airflow_backfill.engine.phases.changes import duplicate_key
from airflow_backfill.engine.planning.aggregate_sql import quote
from airflow_backfill.exceptions import RepeatedKeyError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from airflow_backfill.engine.planning.query import QueryPlan
    from airflow_backfill.job import BackfillJob

log = logging.getLogger(__name__)


def refuse_repeated_appended_keys(job: BackfillJob, plan: QueryPlan, appended_rows: DataFrame) -> None:
    """The rows a range appended must hold each upstream key once (one small Spark job over
    their key columns), as the snapshot proves for its rows."""
    duplicate = duplicate_key(appended_rows, plan.upstream_key)
    if duplicate is not None:
        raise RepeatedKeyError(list(job.primary_key), job.source, f"key {duplicate[0]} appended {duplicate[1]} times")


def count_feed(feed: DataFrame, leading_key: str) -> tuple[int, KeyRange]:
    """The change rows of `feed` and the range of the keys it inserted (`present_rows`
    counts the inserts), in one job: the round counts its rows anyway."""
    from pyspark.sql import functions as F

    inserted, key = F.col(CHANGE_TYPE) == "insert", F.col(quote(leading_key))
    row = feed.agg(
        F.count(F.lit(1)).alias("rows"), F.count(F.when(inserted, 1)).alias("inserts"),
        F.min(F.when(inserted, key)).alias("low"), F.max(F.when(inserted, key)).alias("high"),
        F.count(F.when(inserted & key.isNull(), 1)).alias("nulls"),
    ).collect()[0]
    return int(row["rows"]), KeyRange(leading_key, row["low"], row["high"], bool(row["nulls"]), int(row["inserts"]))


def refuse_inserted_keys_held_twice(
    spark: SparkSession, job: BackfillJob, plan: QueryPlan, feed: DataFrame, inserted: KeyRange, version: int,
) -> None:
    """No key the change `feed` inserted (their range: `inserted`) may be held twice by the
    upstream at `version`.

    Only inserts can add a second row for a key. A query without WHERE has every upstream
    row in the MV, where the MERGE finds the first row, so the caller runs this only for
    queries that filter rows and feeds with inserts.
    """
    from pyspark.sql import functions as F

    keys = feed.filter(F.col(CHANGE_TYPE) == "insert").select(*(F.col(quote(c)) for c in plan.upstream_key))
    refuse_keys_held_twice(spark, job, plan, version, inserted, keys)


def refuse_keys_held_twice(
    spark: SparkSession, job: BackfillJob, plan: QueryPlan, version: int, within: KeyRange,
    keys: DataFrame | None = None,
) -> None:
    """No upstream key in the range `within` (and among `keys` when given) may be held twice
    at `version`: the upstream's key columns are read with Delta's time travel, files
    pruned by the range when the leading key is an integer or a date."""
    from pyspark.sql import functions as F

    upstream = (spark.read.format("delta").option("versionAsOf", version).load(job.source)
                .select(*(F.col(quote(c)) for c in plan.upstream_key)))
    leading = upstream.schema.fields[0]
    if boundable(leading.dataType):
        upstream = upstream.filter(within.predicate(F.col(quote(leading.name)), leading.dataType))
    if keys is not None:
        upstream = upstream.join(keys.distinct(), on=list(plan.upstream_key), how="left_semi")
    duplicate = duplicate_key(upstream, plan.upstream_key)
    if duplicate is not None:
        row, count = duplicate
        held = ", ".join(f"{column}={value}" for column, value in row.items())
        raise RepeatedKeyError(list(job.primary_key), job.source, f"{held} is held {count} times at epoch {version}")
    log.info("upstream keys the round added checked at epoch %s: each is held once", version)
