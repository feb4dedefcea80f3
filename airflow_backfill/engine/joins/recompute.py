"""Recompute a join MV at a round's vector instead of applying the round's changes.

Why: at a small scale a join round costs about twenty small Spark and Delta steps
whatever it changes (its feeds, the walks of each side's changes, the MV's keyed write),
where computing the join whole is three scans and one write: TPC-H Q3's rounds took
about twice its snapshot at SF 1 (docs/benchmarks.md). The round planner picks this way
before any feed is read (`plan_choice.join_recompute_first`).

The join is computed as the snapshot computes it, over every upstream as of its version
in the vector, in one piece; the MV is overwritten in one commit that records the vector
(an aggregate's state first, then its MV, as its rounds write them). Its change feed then
shows every old row deleted and every new row inserted: exact once netted per key, which
is how an MV built on it reads it. When jobs read the MV's feed and the plan says so, only
the rows that differ from the MV are written instead (`rounds/difference.py`). A stateless join's MV key is proved on the rows before
anything is written, as the snapshot proves it.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING

from airflow_backfill.engine.aggregates.apply import recompute_aggregate
from airflow_backfill.engine.delta.commit_fence import at_each_commit
from airflow_backfill.engine.delta.commits import PLAN_FIELD, conform, overwrite
from airflow_backfill.engine.delta.log import rows_written
from airflow_backfill.engine.faults import maybe_crash
from airflow_backfill.engine.joins.relation import flat_rows, reader, walk
from airflow_backfill.engine.planning.aggregate_sql import quote
from airflow_backfill.engine.planning.round_plan import DIFFERENCE
from airflow_backfill.engine.rounds.changes import apply_query, duplicate_key
from airflow_backfill.engine.rounds.difference import write_difference
from airflow_backfill.engine.rounds.plan_choice import keyed_estimates, readers
from airflow_backfill.exceptions import RepeatedKeyError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from pyspark.sql import DataFrame, SparkSession

    from airflow_backfill.engine.delta.commits import CommitInfo
    from airflow_backfill.engine.planning.join_query import JoinPlan
    from airflow_backfill.engine.planning.round_plan import RoundPlan
    from airflow_backfill.job import BackfillJob

log = logging.getLogger(__name__)


def join_at(spark: SparkSession, job: BackfillJob, plan: JoinPlan, vector: Mapping[str, int]) -> DataFrame:
    """The join's flat relation (the `source` of its flat query) over every upstream as of
    its version in `vector`: the tree walked from its root, no table bounded."""
    read = reader(spark, job, plan, vector)
    root = plan.core()[0]
    return walk(plan, root, flat_rows(read(root), plan, root), read, semi_join=False, bounded=False)


def recompute_join(spark: SparkSession, job: BackfillJob, plan: JoinPlan, vector: Mapping[str, int],
                   info: CommitInfo, chosen: RoundPlan) -> int:
    """Overwrite the MV (and an aggregate's state) with the join at `vector`, in commits that
    record it (`info` carries the vector); returns the MV's rows."""
    log.info("%s: recomputing the join MV at versions %s (%s)", info.phase, dict(vector), chosen.reason)
    source = join_at(spark, job, plan, vector)
    if plan.flat.aggregate is not None:
        return recompute_aggregate(spark, job, plan.flat, info, chosen, upstream=source)
    target = spark.read.format("delta").load(job.target).schema
    rows = conform(apply_query(spark, source, plan.flat.query), target)
    metadata = replace(info, extra={**info.extra, PLAN_FIELD: chosen.to_json()})
    if not job.verify_primary_key:
        return _write(rows, job, plan, metadata, chosen)
    rows = rows.cache()  # proved, then written: the join is computed once
    try:
        repeated = repeated_join_key(job, plan, vector, rows.select(*(quote(column) for column in plan.mv_key)))
        if repeated is not None:
            raise repeated
        return _write(rows, job, plan, metadata, chosen)
    finally:
        rows.unpersist()


def repeated_join_key(job: BackfillJob, plan: JoinPlan, vector: Mapping[str, int],
                      keys: DataFrame) -> RepeatedKeyError | None:
    """The error for an MV key that `keys` (the MV key columns of the join's rows at
    `vector`) hold twice; None when each is held once."""
    duplicate = duplicate_key(keys, plan.mv_key)
    if duplicate is None:
        return None
    key, count = duplicate
    held = ", ".join(f"{column}={value}" for column, value in key.items())
    return RepeatedKeyError(list(plan.mv_key), ", ".join(u.table for u in job.upstreams),
                            f"the join holds MV key {held} {count} times at versions {dict(vector)}")


def _write(rows: DataFrame, job: BackfillJob, plan: JoinPlan, info: CommitInfo, chosen: RoundPlan) -> int:
    """Overwrite the MV with `rows` (returns its rows), or write only the rows that differ
    (`writes`: `mv` `difference`; returns the changed keys)."""
    with at_each_commit(partial(maybe_crash, info.phase, "after_write")):
        if chosen.writes.get("mv") == DIFFERENCE:
            _, changed = write_difference(rows.sparkSession, job.target, rows, plan.mv_key, app_id=job.app_id,
                                          version=info.epoch, user_metadata=info.user_metadata(job),
                                          estimates=keyed_estimates(info.parallelism, readers(job)))
        else:
            overwrite(rows.coalesce(info.parallelism), job.target, app_id=job.app_id, version=info.epoch,
                      user_metadata=info.user_metadata(job))
            changed = rows_written(job.target)
    maybe_crash(info.phase, "after_commit")
    return changed
