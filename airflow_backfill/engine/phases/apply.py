"""Apply a range of upstream epochs to the MV in one commit (catch-up and forward).

One epoch range travels downwards: its change rows are read from the upstream's log
store by Spark (only the columns the query needs); for a stateless query they are netted
per upstream key, mapped through the MV query and merged into the MV by Delta's MERGE
together with the new watermark; an aggregate folds them into its per-group state first
(`aggregate_apply`). A stateless range that only appended rows above the MV's largest
key (told from both logs, `delta/appends.py`) skips the feed and the MERGE: the query
over the added files is appended. Every step runs on the executors. Re-running an already committed
range is a no-op: the watermark tells, and Delta skips a transaction version it has.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import pyarrow as pa

from airflow_backfill.engine.aggregates.apply import apply_aggregate_changes, recover_state_ahead
from airflow_backfill.engine.delta.appends import AppendedFiles, appended_prefix
from airflow_backfill.engine.delta.change_feed import (
    check_range_readable,
    check_schema_unchanged,
    read_change_feed,
)
from airflow_backfill.engine.delta.commits import (
    CommitInfo,
    append_new,
    commit_watermark_only,
    conform,
    merge_keyed,
    repeated_key_named,
)
from airflow_backfill.engine.delta.key_range import all_above, table_key_max
from airflow_backfill.engine.delta.log import arrow_schema, load_table, read_watermark, rows_written
from airflow_backfill.engine.faults import maybe_crash
from airflow_backfill.engine.phases.changes import apply_query, mv_changes, net_changes
from airflow_backfill.engine.phases.repeated_keys import (
    refuse_arrived_keys_held_twice,
    refuse_repeated_appended_keys,
)
from airflow_backfill.engine.planning.query import referenced_columns
from airflow_backfill.exceptions import RepeatedKeyError, TargetError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from airflow_backfill.engine.planning.query import QueryPlan
    from airflow_backfill.job import BackfillJob

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AppliedRange:
    """One MV commit of the upstream epochs (start_watermark, end_version]."""

    start_watermark: int
    end_version: int
    change_rows: int
    mv_rows_changed: int
    seconds: float

    @property
    def epochs(self) -> int:
        return self.end_version - self.start_watermark


def current_watermark(job: BackfillJob) -> int:
    """The MV's watermark; an error when the MV was never snapshotted."""
    watermark = read_watermark(job.target, job.app_id)
    if watermark is None:
        raise TargetError(
            f"the MV {job.target} does not exist yet: run the snapshot phase first "
            "(spark_jobs/snapshot.py, or the DAG's snapshot task)."
        )
    return watermark


def apply_epochs(
    spark: SparkSession,
    job: BackfillJob,
    plan: QueryPlan,
    end_version: int,
    *,
    phase: str,
    parallelism: int,
) -> AppliedRange | None:
    """Bring the MV from its watermark towards `end_version` in one commit; None when
    already there. A stateless range that starts with appends and goes on with other
    changes stops after the appends (`end_version` of the result): the caller's next
    round takes the rest."""
    started = time.monotonic()
    start = watermark = current_watermark(job)
    if plan.aggregate is not None:
        watermark = recover_state_ahead(spark, job, plan, watermark, phase=phase, parallelism=parallelism)
    if watermark >= end_version:
        log.info("MV already at watermark %s >= %s: nothing to apply", watermark, end_version)
        if watermark > start:
            return AppliedRange(start, watermark, 0, 0, time.monotonic() - started)
        return None
    check_schema_unchanged(job.source, watermark, end_version)
    spark.conf.set("spark.sql.shuffle.partitions", str(parallelism))
    info = CommitInfo(phase=phase, epoch=end_version, parallelism=parallelism, rows=0)
    if plan.aggregate is not None:
        change_rows, mv_rows_changed = apply_aggregate_changes(spark, job, plan, watermark, info)
    else:
        end_version, change_rows, mv_rows_changed = _apply_stateless(spark, job, plan, watermark, info)
    applied = AppliedRange(start, end_version, change_rows, mv_rows_changed, time.monotonic() - started)
    log.info(
        "%s: applied epochs %s..%s (%s change rows, %s MV keys) in %.2fs",
        phase, watermark + 1, end_version, applied.change_rows, applied.mv_rows_changed, applied.seconds,
    )
    return applied


def feed_columns(job: BackfillJob, plan: QueryPlan) -> list[str] | None:
    """The upstream columns a stateless round reads: the key and what the query references
    (None: all of them, for `SELECT *`). Their names come from the log the round already
    follows with delta-rs: asking Spark would rebuild the upstream's snapshot for a list
    of names."""
    referenced = referenced_columns(plan.query)
    if referenced is None:
        return None
    wanted = referenced | {column.lower() for column in plan.upstream_key}
    return [column for column in arrow_schema(load_table(job.source)).names if column.lower() in wanted]


def _appended_beyond_mv(job: BackfillJob, plan: QueryPlan, watermark: int, end_version: int) -> AppendedFiles | None:
    """The files the range's append-only prefix added, when their keys all lie above the
    MV's largest key (from both tables' statistics; no data is read); else None."""
    upstream_key = _field(arrow_schema(load_table(job.source)), plan.upstream_key[0])
    mv_key = _field(arrow_schema(load_table(job.target)), plan.mv_key[0])
    if upstream_key is None or mv_key is None or not _same_bound_kind(upstream_key.type, mv_key.type):
        return None
    appended = appended_prefix(job.source, watermark, end_version, upstream_key)
    if appended is None or not all_above(appended.keys, table_key_max(job.target, mv_key.name)):
        return None
    return appended


def _append_appended(
    spark: SparkSession, job: BackfillJob, plan: QueryPlan, appended: AppendedFiles, appended_rows: DataFrame,
    watermark: int, info: CommitInfo,
) -> tuple[int, int]:
    """Append the MV query over the added files: every key is new to the MV, so no row of
    the MV is read and nothing is netted. Returns (change rows, MV rows appended)."""
    check_range_readable(job.source, watermark, info.epoch)
    change_rows = appended.keys.present_rows
    metadata = replace(info, rows=change_rows).user_metadata(job)
    target = spark.read.format("delta").load(job.target).schema
    log.info("%s: epochs %s..%s only appended %s rows above the MV's largest key: appending",
             info.phase, watermark + 1, info.epoch, change_rows)
    if not appended.paths:
        maybe_crash(info.phase, "after_write")
        commit_watermark_only(spark, job.target, target, app_id=job.app_id, version=info.epoch,
                              user_metadata=metadata)
        maybe_crash(info.phase, "after_commit")
        return 0, 0
    rows = apply_query(spark, appended_rows, plan.query)
    maybe_crash(info.phase, "after_write")
    written = append_new(conform(rows, target), job.target, app_id=job.app_id, version=info.epoch,
                         user_metadata=metadata)
    maybe_crash(info.phase, "after_commit")
    return change_rows, rows_written(job.target) if written else 0


def _appended_rows(spark: SparkSession, job: BackfillJob, appended: AppendedFiles) -> DataFrame:
    """The rows of the added files (none when the range added no file, only moved the
    watermark), read with the upstream's Delta schema. Nothing is read until a job asks."""
    from pyspark.sql.pandas.types import from_arrow_schema

    schema = from_arrow_schema(arrow_schema(load_table(job.source)))
    if not appended.paths:
        return spark.createDataFrame([], schema)
    return spark.read.schema(schema).parquet(*appended.paths)


def _field(schema: pa.Schema, name: str) -> pa.Field | None:
    """The field called `name`, whatever its case (Spark resolves names case-insensitively)."""
    return next((field for field in schema if field.name.lower() == name.lower()), None)


def _same_bound_kind(upstream: pa.DataType, mv: pa.DataType) -> bool:
    """Both integers or both dates: the kinds whose statistics bound keys exactly."""
    return (pa.types.is_integer(upstream) and pa.types.is_integer(mv)) or (
        pa.types.is_date32(upstream) and pa.types.is_date32(mv))


def _apply_stateless(
    spark: SparkSession, job: BackfillJob, plan: QueryPlan, watermark: int, info: CommitInfo,
) -> tuple[int, int, int]:
    """Net the range's changes per upstream key, map them through the query, MERGE them by MV key.

    The change rows are cached and counted (the commit records them, the rate limit paces
    by them); the MERGE then reads them from memory. When the upstream is asked about the
    keys that arrived (`refuse_arrived_keys_held_twice`), the netted changes are cached
    too, so netting runs once. Returns (the version committed as the watermark, change
    rows read, MV rows the MERGE changed).
    """
    appended = _appended_beyond_mv(job, plan, watermark, info.epoch)
    if appended is not None:
        appended_rows = _appended_rows(spark, job, appended)
        refuse_repeated_appended_keys(spark, job, plan, appended, watermark, appended_rows)
        if appended.end_version < info.epoch:
            log.info("%s: epochs %s..%s only appended; they are applied as a round of their own before "
                     "epochs %s..%s", info.phase, watermark + 1, appended.end_version, appended.end_version + 1,
                     info.epoch)
        info = replace(info, epoch=appended.end_version)
        return (info.epoch, *_append_appended(spark, job, plan, appended, appended_rows, watermark, info))
    feed = read_change_feed(spark, job.source, watermark, info.epoch, feed_columns(job, plan)).cache()
    net = net_changes(feed, plan.upstream_key, refuse_repeated_keys=job.verify_primary_key)
    ask_upstream = job.verify_primary_key and plan.filters_rows
    if ask_upstream:
        net = net.cache()
    try:
        change_rows = feed.count()
        if ask_upstream:
            refuse_arrived_keys_held_twice(spark, job, plan, net, watermark, info.epoch)
        keyed = mv_changes(spark, net, plan)
        maybe_crash(info.phase, "after_write")
        null_safe = any(keyed.schema[column].nullable for column in plan.mv_key)
        changed = merge_keyed(spark, job.target, keyed, plan.mv_key, app_id=job.app_id, version=info.epoch,
                              user_metadata=replace(info, rows=change_rows).user_metadata(job), null_safe=null_safe)
        maybe_crash(info.phase, "after_commit")
        return info.epoch, change_rows, changed
    except Exception as error:
        repeated = repeated_key_named(error)
        if repeated is None:
            raise
        raise RepeatedKeyError(list(job.primary_key), job.source,
                               f"{repeated} is held twice between epochs {watermark + 1} and {info.epoch}") from None
    finally:
        net.unpersist()
        feed.unpersist()
