"""The feed stage of a round: a range's change rows read once, by the driver or by Spark.

A round of any kind (stateless, aggregate) starts from the upstream's change rows of its
range, and what reads them is chosen here, once: the driver when the range's log shows a
small feed of shapes it reads (`delta/driver_feed.py`: Arrow, no Spark job), Spark from
the files the log lists when it can count them from their footers (`delta/listed_feed.py`:
no rebuild of the table's state), else Delta's own change-feed reader (cached and counted).
The caller gets one value whatever read it, with the rows counted (the commit records
them, the rate limit paces by them) and, when the driver read them, the rows as Arrow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_backfill.engine.delta.change_feed import read_change_feed
from airflow_backfill.engine.delta.driver_feed import feed_in_driver
from airflow_backfill.engine.delta.listed_feed import listed_feed
from airflow_backfill.engine.delta.log import column_names, spark_schema, table_at
from airflow_backfill.engine.rounds.changes import count_changes

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType


@dataclass(frozen=True)
class RoundFeed:
    """A range's change rows: the upstream's columns asked for, `_change_type` and
    `_commit_version`."""

    frame: DataFrame
    rows: int | None
    """Change rows; None when not counted (`read_feed(count=False)`, Spark's reader)."""
    arriving: int | None
    """Rows that bring a row in (inserts and post-images), counted with `rows`."""
    upstream: StructType
    """Every upstream column, as Spark types."""
    held: pa.Table | None = None
    """The same rows as Arrow, when the driver read them."""
    cached: bool = False
    """Spark's reader's rows, cached: `release` drops them."""

    @property
    def read_by(self) -> str:
        return "driver" if self.held is not None else "spark"

    def release(self) -> None:
        if self.cached:
            self.frame.unpersist()


def read_feed(spark: SparkSession, source: str, watermark: int, end_version: int, columns: Sequence[str] | None,
              *, count: bool = True) -> RoundFeed:
    """The change rows of versions (watermark, end_version] of `source` (its `columns`, all
    when None), read the cheapest way the range allows (see the module's text). `count`:
    count Spark's reader's rows now (one job), as a stateless round needs; an aggregate's
    fold counts them itself."""
    held = feed_in_driver(spark, source, watermark, end_version, None if columns is None else list(columns))
    if held is not None:  # a small feed: counted already, and not cached (its rows are the driver's)
        return RoundFeed(held.frame, held.rows, held.arriving, held.upstream, held.table)
    wanted = list(columns) if columns is not None else column_names(source)
    listed = listed_feed(spark, source, watermark, end_version, wanted)
    if listed is not None:  # counted from the log: read once, by whatever reads it next
        return RoundFeed(listed.frame, listed.rows, listed.arriving, listed.upstream)
    feed = read_change_feed(spark, source, watermark, end_version, columns)
    upstream = spark_schema(table_at(source, end_version))  # from the log: no table loaded by Spark
    if not count:
        return RoundFeed(feed, None, None, upstream)
    feed = feed.cache()
    rows, arriving = count_changes(feed)
    return RoundFeed(feed, rows, arriving, upstream, cached=True)
