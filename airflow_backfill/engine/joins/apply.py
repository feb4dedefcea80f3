"""Apply a round of a join MV: every upstream from its recorded version to the round's
target, in one MV commit (two for an aggregate) that records the new vector.

The round reads the MV's vector and checks it against the app transaction before it
reads anything else (`watermarks.committed_vector`), checks each moved upstream's range
(its log and change files present, its schema unchanged), turns the change feeds into
signed join rows (`leave_arrive` for a join without LEFT joins over more than a million
upstream rows, whose leaving rows it reads from the MV, or an aggregate's state, where it
can; `delta_rule` otherwise) and then:

- stateless: maps them through the flat query (WHERE and projections keep their signs),
  nets them per whole MV row, and writes them by MV key: a key left with a +1 row takes
  that row, a key left with only a -1 row leaves the MV; a key with two rows or a count
  beyond one means an upstream's key is not unique, and the round is refused;
- aggregate: folds them into the per-group state and the MV (`fold_signed_rows`), as
  a one-upstream aggregate folds its signed change rows.

The keyed changes are written through the keyed writes (`rounds/write.py`) the
way the round planner estimates cheapest: append, replace, delete, MERGE or overwrite,
all of which give the same rows for changes that hold one row per key. Before any feed
is read, the planner may instead recompute the join at the target vector
(`joins/recompute.py`) when that saves enough over the least a round costs; the keyed
writes' estimates after the feed leave recompute out (the feeds are paid by then). All
writes go through `rounds.write.write`,
`commit_watermark_only` and the aggregate fold, so a re-run of a committed round is
skipped by the app transaction (the vector's sum).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Mapping
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING

from airflow_backfill.engine.aggregates.apply import bring_mv_to_state, fold_signed_rows
from airflow_backfill.engine.aggregates.state import state_uri
from airflow_backfill.engine.delta.change_feed import check_schema_unchanged
from airflow_backfill.engine.delta.commit_fence import at_each_commit
from airflow_backfill.engine.delta.commits import (
    PLAN_FIELD,
    PRESENT,
    CommitInfo,
    commit_watermark_only,
    repeated_key_error,
    repeated_key_named,
)
from airflow_backfill.engine.delta.driver_rows import held_or_cached
from airflow_backfill.engine.faults import maybe_crash
from airflow_backfill.engine.joins import delta_rule, leave_arrive
from airflow_backfill.engine.joins.driver_keyed import keyed_and_old_in_driver, keyed_changes_in_driver
from airflow_backfill.engine.joins.recompute import recompute_join
from airflow_backfill.engine.joins.relation import flat_schema, reader, upstream_uri
from airflow_backfill.engine.joins.watermarks import (
    Vector,
    committed_vector,
    join_commit_info,
    table_vector,
    vector_sum,
)
from airflow_backfill.engine.planning.aggregate_sql import quote
from airflow_backfill.engine.planning.round_plan import JOIN_ROUND, WATERMARK_ONLY, RoundPlan
from airflow_backfill.engine.rounds.applied import AppliedRange
from airflow_backfill.engine.rounds.changes import SIGN, apply_query
from airflow_backfill.engine.rounds.exact_values import grouped_rows
from airflow_backfill.engine.rounds.plan_choice import (
    join_recompute_first,
    keyed_estimates,
    plan_round,
    readers,
    record_round,
)
from airflow_backfill.engine.rounds.write import prepare, write
from airflow_backfill.exceptions import RepeatedKeyError, TargetError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from airflow_backfill.engine.planning.join_query import JoinPlan
    from airflow_backfill.job import BackfillJob

log = logging.getLogger(__name__)

_COUNT, _ROWS_FOR_KEY = "__count", "__rows_for_key"


def current_vector(job: BackfillJob) -> Vector:
    """The MV's vector, checked; an error when the MV was never snapshotted."""
    vector = committed_vector(job)
    if vector is None:
        raise TargetError(
            f"the MV {job.target} does not exist yet: run the snapshot phase first "
            "(spark_jobs/snapshot.py, or the DAG's snapshot task)."
        )
    return vector


def apply_join_round(
    spark: SparkSession, job: BackfillJob, plan: JoinPlan, target: Mapping[str, int], *, phase: str,
    parallelism: int,
) -> AppliedRange | None:
    """Bring the MV from its vector to `target` (no upstream moves backwards) in one round;
    None when there is nothing to apply."""
    started = time.monotonic()
    start = watermark = current_vector(job)
    if plan.flat.aggregate is not None:
        watermark = _recover_state_ahead(spark, job, plan, watermark, phase=phase, parallelism=parallelism)
    target = {name: max(version, watermark[name]) for name, version in target.items()}
    if target == watermark:
        if watermark != start:
            return AppliedRange(vector_sum(start), vector_sum(watermark), 0, 0, time.monotonic() - started)
        return None
    for name, version in target.items():
        if version > watermark[name]:
            check_schema_unchanged(upstream_uri(job, name), watermark[name], version)
    spark.conf.set("spark.sql.shuffle.partitions", str(parallelism))
    info = join_commit_info(job, CommitInfo(phase=phase, epoch=0, parallelism=parallelism, rows=0), target)
    early, least = join_recompute_first(job, watermark, target, parallelism, aggregate=plan.flat.aggregate is not None,
                                        prove_key=plan.flat.aggregate is None and job.verify_primary_key)
    if early is not None:  # no feed is read
        rows = recompute_join(spark, job, plan, target, info, early)
        seconds = time.monotonic() - started
        record_round(job, early, seconds, vector_sum(target))
        log.info("%s: recomputed at %s (%s MV rows) in %.2fs", phase, target, rows, seconds)
        return AppliedRange(vector_sum(start), vector_sum(target), 0, rows, seconds, early.label)
    rule = leave_arrive if leave_arrive.applies(plan) and leave_arrive.pays_off(job) else delta_rule
    changes = rule.join_changes(spark, job, plan, watermark, target)
    try:
        if plan.flat.aggregate is not None:
            schema = _flat_struct(spark, job, plan, target)
            # recompute_at=None: a join recomputes before its feeds are read, not once they are
            _, changed, chosen = fold_signed_rows(spark, job, plan.flat, changes.rows, schema, info,
                                                  recompute_at=None, leaving_groups=changes.leaving_groups,
                                                  change_rows=changes.change_rows)
            recorded = time.monotonic() - started
        else:
            changed, chosen, recorded = _write_stateless(
                spark, job, plan, changes.rows, changes.leaving, replace(info, rows=changes.change_rows), watermark)
    finally:
        changes.unpersist()
    change_rows = changes.change_rows
    seconds = time.monotonic() - started
    record_round(job, chosen, recorded, vector_sum(target))
    record_round(job, RoundPlan(JOIN_ROUND, {}, "", least), seconds, vector_sum(target))
    applied = AppliedRange(vector_sum(start), vector_sum(target), change_rows, changed, seconds, chosen.label)
    log.info("%s: applied %s -> %s (%s change rows, %s MV rows, plan %s) in %.2fs", phase, watermark, target,
             change_rows, changed, applied.plan, applied.seconds)
    return applied


def _write_stateless(spark: SparkSession, job: BackfillJob, plan: JoinPlan, signed: DataFrame,
                     leaving: DataFrame | None, info: CommitInfo,
                     watermark: Mapping[str, int]) -> tuple[int, RoundPlan, float]:
    """Net the signed MV rows per MV key and write them with the vector, the way the round
    planner estimates cheapest among the keyed writes. Returns (MV keys changed, the plan,
    the seconds the write took).

    The plan's estimates cover the MV write only (the delta rule's terms cost the same
    whatever the way), and so does the duration recorded for the job's corrections.
    Recompute is not among them: a join recomputes before its feeds are read, not once
    they are paid for.
    """
    started = time.monotonic()
    keyed = prepared = None
    try:
        # Holding the changes evaluates them: a repeated key fails here, before any write.
        # Few keyed changes are held by the driver: the write's plans then run no job.
        changes, old_rows = keyed_changes_and_old_rows(spark, plan, signed, leaving)
        keyed = held_or_cached(changes)
        prepared = prepare(spark, job.target, keyed, plan.mv_key, null_safe=plan.null_safe_key, old_rows=old_rows)
        keys = prepared.changed.rows or 0
        if not keys:
            chosen = RoundPlan(WATERMARK_ONLY, {}, "the epochs changed no MV row")
            with at_each_commit(partial(maybe_crash, info.phase, "after_write")):
                commit_watermark_only(spark, job.target, app_id=job.app_id, version=info.epoch,
                                      user_metadata=info.user_metadata(job))
            maybe_crash(info.phase, "after_commit")
            return 0, chosen, time.monotonic() - started
        facts = prepared.facts
        chosen = plan_round(job, keyed_estimates(info.parallelism, readers(job))(prepared),
                            f"{info.rows} signed join rows, {keys} MV keys, {facts.touched_rows} of {facts.rows} "
                            "MV rows in touched files")
        metadata = replace(info, extra={**info.extra, PLAN_FIELD: chosen.to_json()})
        written = time.monotonic()
        with at_each_commit(partial(maybe_crash, info.phase, "after_write")):
            changed = write(spark, prepared, chosen.plan, app_id=job.app_id, version=info.epoch,
                            user_metadata=metadata.user_metadata(job))
        seconds = time.monotonic() - written
        maybe_crash(info.phase, "after_commit")
        return changed, chosen, seconds
    except Exception as error:
        repeated = repeated_key_named(error)
        if repeated is None:
            raise
        raise RepeatedKeyError(
            list(plan.mv_key), ", ".join(u.table for u in job.upstreams),
            f"the MV row with {repeated} would be held twice between versions {dict(watermark)} and "
            f"{_vector(info)} (the key of some upstream is repeated)",
        ) from None
    finally:
        if prepared is not None:
            prepared.release()
        if keyed is not None:
            keyed.unpersist()


def keyed_changes_and_old_rows(spark: SparkSession, plan: JoinPlan, signed: DataFrame,
                               leaving: DataFrame | None = None) -> tuple[DataFrame, pa.Table | None]:
    """`keyed_changes`, and when the driver worked them out, the MV rows they replace or
    delete (each changed key's old row: a patch's old images, read from no file)."""
    mapped = apply_query(spark, signed, signed_query(plan.flat.query))
    held = keyed_and_old_in_driver(mapped, leaving, plan.mv_key)
    if held is not None:
        return held
    return keyed_changes(spark, plan, signed, leaving), None


def keyed_changes(spark: SparkSession, plan: JoinPlan, signed: DataFrame, leaving: DataFrame | None = None) -> DataFrame:
    """One change per changed MV key: its new row with `__present`, or `__present` null
    when the key leaves the MV.

    The signed rows are mapped through the flat query, the MV rows that `leaving` holds
    (already mapped, signed -1) are added, and all are counted per whole row; what is
    left is the MV's change as a multiset (rows counted by their exact values:
    `grouped_rows`). With unique upstream keys a key then has at
    most one row counted +1 (its new row) and one counted -1 (its old row); anything
    else raises the repeated-key error when the rows are evaluated.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    mapped = apply_query(spark, signed, signed_query(plan.flat.query))
    held = keyed_changes_in_driver(mapped, leaving, plan.mv_key)
    if held is not None:
        return held
    if leaving is not None:
        mapped = mapped.unionByName(leaving.select(*(quote(c) for c in mapped.columns)))
    columns = [c for c in mapped.columns if c != SIGN]
    counted = grouped_rows(mapped, columns, {_COUNT: F.sum(SIGN)}).filter(F.col(_COUNT) != 0)
    per_key = Window.partitionBy(*(F.col(quote(k)) for k in plan.mv_key))
    arriving = F.sum(F.when(F.col(_COUNT) > 0, 1).otherwise(0)).over(per_key)
    rows = counted.withColumn(_ROWS_FOR_KEY, arriving)
    repeated = (F.abs(F.col(_COUNT)) > 1) | (F.col(_ROWS_FOR_KEY) > 1)
    present = F.when(repeated, repeated_key_error(plan.mv_key)).when(F.col(_COUNT) > 0, F.lit(True))
    return rows.filter((F.col(_COUNT) > 0) | (F.col(_ROWS_FOR_KEY) == 0)).select(
        *(quote(c) for c in columns), present.cast("boolean").alias(PRESENT))


@functools.lru_cache(maxsize=64)
def signed_query(flat_query: str) -> str:
    """The flat stateless query with `__sign` carried to its output."""
    from sqlglot import exp

    from airflow_backfill.engine.planning.query import parse_single_select

    select = parse_single_select(flat_query)
    select.set("expressions", [*select.expressions, exp.column(SIGN)])
    return select.sql(dialect="spark")


def _flat_struct(spark: SparkSession, job: BackfillJob, plan: JoinPlan, versions: Mapping[str, int]) -> StructType:
    read = reader(spark, job, plan, versions)
    return flat_schema(plan, {table.name: read.schema(i) for i, table in enumerate(plan.tables)})


def _recover_state_ahead(spark: SparkSession, job: BackfillJob, plan: JoinPlan, mv: Vector, *, phase: str,
                         parallelism: int) -> Vector:
    """After a crash between an aggregate round's state and MV commits, bring the MV to the
    state's vector first. Returns the MV's vector afterwards."""
    names = [upstream.name for upstream in job.upstreams]
    state = table_vector(state_uri(job.target), job.app_id, names)
    if state is None or state == mv:
        return mv
    if any(state[name] < mv[name] for name in names):
        raise TargetError(
            f"the aggregate state of MV {job.target} is at versions {state}, behind the MV's {mv}; it was "
            "changed by something else. Rebuild the MV: delete the target and rerun the snapshot."
        )
    log.warning("aggregate state is at %s, the MV at %s (a run stopped between the two commits): bringing the "
                "MV up to the state", state, mv)
    info = CommitInfo(phase=phase, epoch=0, parallelism=parallelism, rows=0, extra={"recovered_from_state": "true"})
    bring_mv_to_state(spark, job, plan.flat, _flat_struct(spark, job, plan, state), join_commit_info(job, info, state))
    return state


def _vector(info: CommitInfo) -> str:
    from airflow_backfill.engine.joins.watermarks import WATERMARKS

    return info.extra.get(WATERMARKS, "?")
