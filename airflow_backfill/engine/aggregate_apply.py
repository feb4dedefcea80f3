"""Apply a range of upstream epochs to an aggregate MV (catch-up and forward rounds).

A round's cost follows the change, not the upstream:

1. Spark evaluates WHERE, the GROUP BY keys and the aggregate arguments over the
   range's change rows, signed +1 arriving and -1 leaving, and they are combined per
   touched group into a delta (`aggregate_delta`);
2. the old state of just those groups is read from the state table on the driver and
   joined to the delta; Spark adds them up: counts and sums are exact; MIN/MAX keep the
   old extreme unless a removed value may have been it;
3. only the groups whose MIN/MAX may have moved, and groups with a COUNT(DISTINCT),
   are recomputed from the upstream as of the new epoch (its files listed by the Delta
   log, semi-joined with the broadcast group keys) — a query with only COUNT, SUM and
   AVG never reads the upstream's files;
4. one statement returns, per touched group, its new state and the MV change it causes
   (its MV row from the new state against the one from the old state, carried in the
   same row); the state is committed (groups at zero rows deleted), then the MV
   changes, both with the new epoch as watermark (see `aggregate_state` for why two
   tables and how a crash between the commits is recovered).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from airflow_backfill.engine import aggregate_sql as sql
from airflow_backfill.engine.aggregate_delta import range_delta
from airflow_backfill.engine.aggregate_state import (
    commit_state_watermark,
    merge_state,
    open_state,
    read_delta,
    read_state,
    read_state_rows,
    require_state,
    state_struct,
)
from airflow_backfill.engine.aggregate_view import cast_to, mv_changes, value_types, visible_rows
from airflow_backfill.engine.arrow_join import left_join_null_safe
from airflow_backfill.engine.changes import FEED_COLUMNS
from airflow_backfill.engine.collect import small_result_to_arrow
from airflow_backfill.engine.delta_log import arrow_schema, load_table, open_upstream
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

_TOUCHED, _NEW, _KEYS, _RECOMPUTED = (
    "__airflow_backfill_touched", "__airflow_backfill_new", "__airflow_backfill_keys",
    "__airflow_backfill_recomputed",
)


def recover_state_ahead(
    spark: SparkSession, job: BackfillJob, plan: QueryPlan, mv_watermark: int, *, phase: str, parallelism: int
) -> int:
    """Bring the MV up to the state's watermark after a crash between their commits.

    Returns the MV's watermark afterwards. The MV rows are recomputed from the whole
    state and diffed with the whole MV: a full read of both, paid only after a crash.
    """
    state, state_watermark = require_state(job)
    aggregate = _aggregate(plan)
    state_struct(job, [*sql.key_columns(aggregate), *sql.state_value_columns(aggregate)], state)
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
    target = load_table(job.target)
    mv_schema = _spark_schema(arrow_schema(target))
    upstream = _upstream_struct(job.source, state_watermark)
    new_rows = visible_rows(spark, aggregate, read_state(spark, job), value_types(spark, aggregate, upstream),
                            mv_schema)
    old_rows = cast_to(read_delta(spark, job.target), mv_schema)
    changes = conform_changes(mv_changes(old_rows, new_rows, plan.mv_key).toArrow(), target)
    info = CommitInfo(phase=phase, epoch=state_watermark, parallelism=parallelism, rows=changes.num_rows,
                      extra={"recovered_from_state": "true"})
    merge_changes(job, changes, plan.mv_key, info, null_safe_keys=True, deletes_known=True, table=target)
    return state_watermark


def apply_aggregate_changes(
    spark: SparkSession, job: BackfillJob, plan: QueryPlan, feed: pa.Table, end_version: int, *,
    phase: str, parallelism: int,
) -> int:
    """Fold the change rows of one range into the state and the MV; returns MV rows changed."""
    aggregate = _aggregate(plan)
    target, state = load_table(job.target), open_state(job)
    mv_schema = _spark_schema(arrow_schema(target))
    rows = _touched_groups(spark, job, aggregate, feed, end_version, state, mv_schema)
    state_changes = _state_changes(aggregate, rows, job)
    mv_rows = _mv_changes(rows, mv_schema, target)
    maybe_crash(phase, "after_write")
    state_info = CommitInfo(phase=phase, epoch=end_version, parallelism=parallelism, rows=state_changes.num_rows)
    merge_state(job, state, state_changes, sql.key_columns(aggregate), state_info)
    maybe_crash(phase, "after_state_commit")
    info = CommitInfo(phase=phase, epoch=end_version, parallelism=parallelism, rows=mv_rows.num_rows,
                      extra={"groups_changed": str(state_changes.num_rows)})
    merge_changes(job, mv_rows, plan.mv_key, info, null_safe_keys=True, deletes_known=True, table=target)
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
    spark: SparkSession, job: BackfillJob, aggregate: AggregateQuery, feed: pa.Table, end_version: int,
    state: DeltaTable, mv_schema: StructType,
) -> pa.Table:
    """Per group the changes touch: its new state and the MV change it causes (`changes_sql`).

    The old state of the touched groups is read and joined to the delta on the driver,
    so what follows is a projection of a local relation, which Spark folds while
    planning. The upstream is read only when a MIN, MAX or COUNT(DISTINCT) must be
    recomputed for some group.
    """
    keys = sql.key_columns(aggregate)
    schema = state_struct(job, [*keys, *sql.state_value_columns(aggregate)], state)
    delta = range_delta(spark, aggregate, feed, schema)
    old = read_state_rows(state, delta.select(keys))
    old = old.rename_columns([c if c in keys else f"{sql.OLD}{c}" for c in old.column_names])
    spark.createDataFrame(left_join_null_safe(delta, old, keys)).createOrReplaceTempView(_TOUCHED)
    state_types = [(field.name, field.dataType.simpleString()) for field in schema.fields]
    carried = (*_FLAGS, *sql.old_columns(aggregate))
    new_state = (f"SELECT {', '.join(sql.cast_expressions(state_types, carried))} "
                 f"FROM ({sql.new_state_sql(aggregate, _TOUCHED)}) s")
    new = f"({new_state}) n"  # one statement, one analysis, when nothing is recomputed
    if aggregate.needs_recompute:
        _with_recomputed(spark, job, aggregate, spark.sql(new_state), end_version, schema, carried) \
            .createOrReplaceTempView(_NEW)
        new = _NEW
    types = value_types(spark, aggregate, _upstream_columns(feed.schema))
    mv_types = [field.dataType.simpleString() for field in mv_schema.fields]
    return small_result_to_arrow(spark.sql(sql.changes_sql(aggregate, new, types, mv_types)), delta.num_rows)


def _with_recomputed(
    spark: SparkSession, job: BackfillJob, aggregate: AggregateQuery, new: DataFrame, end_version: int,
    schema: StructType, carried: tuple[str, ...],
) -> DataFrame:
    """`new` with the MIN/MAX/COUNT(DISTINCT) of flagged groups read from the upstream
    as of `end_version` (its files listed by the Delta log, semi-joined with the keys)."""
    new.createOrReplaceTempView(_NEW)
    keys = ", ".join(sql.key_columns(aggregate))
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


def _mv_changes(rows: pa.Table, mv_schema: StructType, target: DeltaTable) -> pa.Table:
    """The MV rows to upsert or delete, named and typed as the MV."""
    change = rows[sql.MV_CHANGE]
    changed = rows.filter(pc.is_valid(change))
    present = pc.if_else(pc.equal(changed[sql.MV_CHANGE], "upsert"), True, None)
    columns = [changed[sql.mv_column(i)] for i in range(len(mv_schema.fields))]
    names = [field.name for field in mv_schema.fields]
    return conform_changes(pa.table([*columns, present], names=[*names, PRESENT]), target)


def _aggregate(plan: QueryPlan) -> AggregateQuery:
    if plan.aggregate is None:
        raise TypeError("an aggregate plan is required")
    return plan.aggregate


def _spark_schema(schema: pa.Schema) -> StructType:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


def _upstream_struct(source: str, version: int) -> StructType:
    return _spark_schema(arrow_schema(open_upstream(source, version)))


def _upstream_columns(feed: pa.Schema) -> StructType:
    """The upstream's columns of a change feed, as a Spark schema."""
    return _spark_schema(pa.schema([field for field in feed if field.name not in FEED_COLUMNS]))
