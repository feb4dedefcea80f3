"""Which readers read an MV's change feed exactly, recorded on the MV itself.

Spark (delta-spark) reads every commit's feed exactly. delta-rs 1.6 reads the feed of
appends and MERGEs exactly, but not that of the replaces, deletes, overwrites and
recomputes whose rows the feed derives from deletion vectors
(`planning/round_plan.FEED_FOR_EVERY_READER`); only `round_plan: merge` keeps to the
first two. A downstream consumer cannot tell which plan wrote an MV, so the MV says it:
the table property `airflow_backfill.feedReaders` lists the readers, set when the MV is
created and changed (by a commit of its own) when a phase runs under a round plan that
reads otherwise. The asset events and `airflow-backfill status` repeat it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from airflow_backfill.engine.planning.round_plan import MERGE

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_backfill.job import BackfillJob

log = logging.getLogger(__name__)

FEED_READERS_PROPERTY = "airflow_backfill.feedReaders"
"""The MV's table property: the readers that read its change feed exactly, comma-separated."""
SPARK_READER = "delta-spark"
DELTA_RS_READER = "delta-rs"


def feed_readers(round_plan: str) -> tuple[str, ...]:
    """The readers that read the feed of an MV whose rounds follow `round_plan` exactly."""
    return (SPARK_READER, DELTA_RS_READER) if round_plan == MERGE else (SPARK_READER,)


def feed_reader_properties(job: BackfillJob) -> dict[str, str]:
    """The table property a new MV of `job` is created with."""
    return {FEED_READERS_PROPERTY: ",".join(feed_readers(job.round_plan))}


def recorded_feed_readers(target: str) -> list[str] | None:
    """The readers the MV at `target` records (delta-rs, no JVM); None when the MV does not
    exist or predates the property."""
    from airflow_backfill.engine.delta.log import load_table, table_exists

    if not table_exists(target):
        return None
    value = load_table(target).metadata().configuration.get(FEED_READERS_PROPERTY)
    return None if value is None else [reader for reader in value.split(",") if reader]


def record_feed_readers(spark: SparkSession, job: BackfillJob) -> bool:
    """Set the MV's property to the readers of `job.round_plan` when it says otherwise (an MV
    created before the property, or a run whose `round_plan` reads differently): one
    metadata commit, under the phase's writer lock. True when it committed."""
    wanted = feed_readers(job.round_plan)
    if recorded_feed_readers(job.target) == list(wanted):
        return False
    path = job.target.replace("`", "``")
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('{FEED_READERS_PROPERTY}' = '{','.join(wanted)}')")
    log.info("the MV's change feed is read exactly by %s from here on (round_plan %s)", ", ".join(wanted),
             job.round_plan)
    return True
