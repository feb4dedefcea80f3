"""Apply a range of upstream epochs to an aggregate MV (catch-up and forward rounds).

A round's cost follows the change, not the upstream:

1. the change feed of the range becomes signed rows (+1 arriving, -1 leaving) and is
   aggregated per touched group into a delta (`aggregate_sql.delta_sql`);
2. the old state of just those groups is read from the state table and the delta added:
   counts and sums are exact; MIN/MAX keep the old extreme unless a removed value may
   have been it;
3. only the groups whose MIN/MAX may have moved, and groups with a COUNT(DISTINCT),
   are recomputed from the upstream as of the new epoch (its files listed by the Delta
   log, semi-joined with the broadcast group keys) — a query with only COUNT, SUM and
   AVG never reads the upstream's files;
4. one Spark action returns, per touched group, its new state and the MV change it
   causes (its MV row from the new state against the one from the old state, carried
   in the same row); the state is committed (groups at zero rows deleted), then the MV
   changes, both with the new epoch as watermark (see `aggregate_state` for why two
   tables and how a crash between the commits is recovered).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from airflow_backfill.engine import aggregate_sql as sql
from airflow_backfill.engine.aggregate_state import (
    commit_state_watermark,
    merge_state,
    read_delta,
    read_state,
    require_state_watermark,
    state_struct,
)
from airflow_backfill.engine.aggregate_view import cast_to, mv_changes, value_types, visible_rows
from airflow_backfill.engine.changes import signed_changes
from airflow_backfill.engine.delta_log import open_upstream
from airflow_backfill.engine.faults import maybe_crash
from airflow_backfill.engine.mv_commit import (
    PRESENT,
    CommitInfo,
    commit_watermark_only,
    conform_changes,
    merge_changes,
)
from airflow_backfill.exceptions import TargetError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from airflow_backfill.engine.aggregate_query import AggregateQuery
    from airflow_backfill.engine.query import QueryPlan
    from airflow_backfill.job import BackfillJob

log = logging.getLogger(__name__)

_FLAGS = (sql.EXISTED, sql.RECOMPUTE)

_DELTA, _STATE, _OLD, _NEW, _KEYS, _RECOMPUTED, _TOUCHED = (
    "__airflow_backfill_delta", "__airflow_backfill_state_all", "__airflow_backfill_old",
    "__airflow_backfill_new", "__airflow_backfill_keys", "__airflow_backfill_recomputed",
    "__airflow_backfill_touched",
)


def recover_state_ahead(
    spark: SparkSession, job: BackfillJob, plan: QueryPlan, mv_watermark: int, *, phase: str, parallelism: int
) -> int:
    """Bring the MV up to the state's watermark after a crash between their commits.

    Returns the MV's watermark afterwards. The MV rows are recomputed from the whole
    state and diffed with the whole MV: a full read of both, paid only after a crash.
    """
    state_watermark = require_state_watermark(job)
    aggregate = _aggregate(plan)
    state_struct(job, [*sql.key_columns(aggregate), *sql.state_value_columns(aggregate)])
    if state_watermark == mv_watermark:
        return mv_watermark
    if state_watermark < mv_watermark:
        raise TargetError(
            f"the aggregate state of MV {job.target} is at epoch {state_watermark}, behind the MV's "
            f"watermark {mv_watermark}; it was changed by something else. Rebuild the MV: delete the "
            "target and rerun the snapshot."
        )
    log.warning("aggregate state is at epoch %s, the MV at %s (a run stopped between the two commits): "
                "bringing the MV up to the state", state_watermark, mv_watermark)
    mv_schema = _mv_struct(job)
    upstream = _upstream_struct(job.source, state_watermark)
    new_rows = visible_rows(spark, aggregate, read_state(spark, job), value_types(spark, aggregate, upstream),
                            mv_schema)
    old_rows = cast_to(read_delta(spark, job.target), mv_schema)
    changes = conform_changes(mv_changes(old_rows, new_rows, plan.mv_key).toArrow(), job.target)
    info = CommitInfo(phase=phase, epoch=state_watermark, parallelism=parallelism, rows=changes.num_rows,
                      extra={"recovered_from_state": "true"})
    merge_changes(job, changes, plan.mv_key, info, null_safe_keys=True, deletes_known=True)
    return state_watermark


def apply_aggregate_changes(
    spark: SparkSession, job: BackfillJob, plan: QueryPlan, changes: DataFrame, end_version: int, *,
    phase: str, parallelism: int,
) -> int:
    """Fold the change rows of one range into the state and the MV; returns MV rows changed."""
    aggregate = _aggregate(plan)
    types = value_types(spark, aggregate, _without_feed_columns(changes.schema))
    mv_schema = _mv_struct(job)
    cached: list[DataFrame] = []
    try:
        touched = _touched_groups(spark, job, aggregate, changes, end_version, cached)
        touched.createOrReplaceTempView(_TOUCHED)
        mv_types = [field.dataType.simpleString() for field in mv_schema.fields]
        rows = spark.sql(sql.changes_sql(aggregate, _TOUCHED, types, mv_types)).toArrow()
    finally:
        for frame in cached:
            frame.unpersist()
    state_changes = _state_changes(aggregate, rows, job)
    mv_rows = _mv_changes(rows, mv_schema, job)
    maybe_crash(phase, "after_write")
    state_info = CommitInfo(phase=phase, epoch=end_version, parallelism=parallelism, rows=state_changes.num_rows)
    merge_state(job, state_changes, sql.key_columns(aggregate), state_info)
    maybe_crash(phase, "after_state_commit")
    info = CommitInfo(phase=phase, epoch=end_version, parallelism=parallelism, rows=mv_rows.num_rows,
                      extra={"groups_changed": str(state_changes.num_rows)})
    merge_changes(job, mv_rows, plan.mv_key, info, null_safe_keys=True, deletes_known=True)
    maybe_crash(phase, "after_commit")
    return mv_rows.num_rows


def commit_watermarks_only(job: BackfillJob, end_version: int, *, phase: str, parallelism: int) -> int:
    """A range without change rows (e.g. an upstream MV's watermark-only commits): no Spark work,
    the state's then the MV's watermark move to `end_version`."""
    info = CommitInfo(phase=phase, epoch=end_version, parallelism=parallelism, rows=0)
    commit_state_watermark(job, info)
    maybe_crash(phase, "after_state_commit")
    commit_watermark_only(job, info)
    maybe_crash(phase, "after_commit")
    return 0


def _touched_groups(
    spark: SparkSession, job: BackfillJob, aggregate: AggregateQuery, changes: DataFrame, end_version: int,
    cached: list[DataFrame],
) -> DataFrame:
    """New state (old state alongside) of each group the changes touch, as a lazy DataFrame.

    Only when the query has MIN/MAX/COUNT(DISTINCT) is something computed here: whether
    any group needs them recomputed, so that the upstream is read only then.
    """
    signed_changes(changes).createOrReplaceTempView("source")
    spark.sql(sql.delta_sql(aggregate)).createOrReplaceTempView(_DELTA)
    read_state(spark, job).createOrReplaceTempView(_STATE)
    keys = ", ".join(sql.key_columns(aggregate))
    same = " AND ".join(f"o.{c} <=> d.{c}" for c in sql.key_columns(aggregate))
    spark.sql(
        f"SELECT /*+ BROADCAST(d) */ o.* FROM {_STATE} o LEFT SEMI JOIN (SELECT {keys} FROM {_DELTA}) d ON {same}"
    ).createOrReplaceTempView(_OLD)
    schema = state_struct(job, [*sql.key_columns(aggregate), *sql.state_value_columns(aggregate)])
    carried = (*_FLAGS, *sql.old_columns(aggregate))
    new = cast_to(spark.sql(sql.new_state_sql(aggregate, _DELTA, _OLD)), schema, keep=carried)
    if not aggregate.needs_recompute:
        return new
    # Referenced twice below (flagged keys, and the rows they complete): computed once.
    new = new.cache()
    cached.append(new)
    new.createOrReplaceTempView(_NEW)
    flagged = spark.sql(f"SELECT {keys} FROM {_NEW} WHERE {sql.RECOMPUTE}")
    if flagged.isEmpty():  # e.g. inserts only, for MIN/MAX: the upstream is not read
        return new
    flagged.createOrReplaceTempView(_KEYS)
    read_delta(spark, job.source, end_version).createOrReplaceTempView("source")
    spark.sql(sql.recompute_sql(aggregate, _KEYS)).createOrReplaceTempView(_RECOMPUTED)
    recomputed = spark.sql(sql.with_recomputed_sql(aggregate, _NEW, _RECOMPUTED))
    return cast_to(recomputed, schema, keep=carried)


def _state_changes(aggregate: AggregateQuery, rows: pa.Table, job: BackfillJob) -> pa.Table:
    """State rows to upsert (groups with rows) or delete (groups that had state and are now empty)."""
    counts = rows[sql.ROWS]
    if pc.any(pc.less(counts, 0)).as_py():
        raise TargetError(
            f"the aggregate state of MV {job.target} went negative for some group: the state does not "
            "match the upstream's change feed. Rebuild the MV: delete the target and rerun the snapshot."
        )
    live = pc.greater(counts, 0)
    changed = rows.filter(pc.or_(live, rows[sql.EXISTED]))
    present = pc.if_else(pc.greater(changed[sql.ROWS], 0), True, None)
    columns = [*sql.key_columns(aggregate), *sql.state_value_columns(aggregate)]
    return changed.select(columns).append_column(PRESENT, present)


def _mv_changes(rows: pa.Table, mv_schema: StructType, job: BackfillJob) -> pa.Table:
    """The MV rows to upsert or delete, named and typed as the MV."""
    change = rows[sql.MV_CHANGE]
    changed = rows.filter(pc.is_valid(change))
    present = pc.if_else(pc.equal(changed[sql.MV_CHANGE], "upsert"), True, None)
    columns = [changed[sql.mv_column(i)] for i in range(len(mv_schema.fields))]
    names = [field.name for field in mv_schema.fields]
    return conform_changes(pa.table([*columns, present], names=[*names, PRESENT]), job.target)


def _aggregate(plan: QueryPlan) -> AggregateQuery:
    if plan.aggregate is None:
        raise TypeError("an aggregate plan is required")
    return plan.aggregate


def _mv_struct(job: BackfillJob) -> StructType:
    from deltalake import DeltaTable
    from pyspark.sql.pandas.types import from_arrow_schema

    from airflow_backfill.engine.delta_log import arrow_schema

    return from_arrow_schema(arrow_schema(DeltaTable(job.target)))


def _upstream_struct(source: str, version: int) -> StructType:
    from pyspark.sql.pandas.types import from_arrow_schema

    from airflow_backfill.engine.delta_log import arrow_schema

    return from_arrow_schema(arrow_schema(open_upstream(source, version)))


def _without_feed_columns(schema: StructType) -> StructType:
    from pyspark.sql.types import StructType

    from airflow_backfill.engine.changes import CHANGE_TYPE, COMMIT_TIMESTAMP, COMMIT_VERSION

    feed = {CHANGE_TYPE, COMMIT_VERSION, COMMIT_TIMESTAMP}
    return StructType([field for field in schema.fields if field.name not in feed])
