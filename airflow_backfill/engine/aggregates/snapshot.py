"""Snapshot of an aggregate MV: partial states per chunk, combined into state and MV at the end.

Each chunk appends the partial per-group state of its upstream files to a staging Delta
table (`<target>/_airflow_backfill/snapshot_partials`), one idempotent commit per chunk,
so a killed snapshot resumes with the chunks not yet done. The commit combines the
partials (counts and sums added, MIN of MINs, MAX of MAXes, the union of COUNT(DISTINCT)
value sets), creates the state table, then the MV from it, both at the pinned epoch, and
drops the partials. A state left by a run killed between the two commits is discarded
and rebuilt from the partials.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

from airflow_backfill.engine.aggregates.state import discard_state, state_uri
from airflow_backfill.engine.aggregates.view import analyse, cast_to, value_types, visible_rows
from airflow_backfill.engine.commit_after import commit_after
from airflow_backfill.engine.delta.commits import append
from airflow_backfill.engine.delta.log import table_exists
from airflow_backfill.engine.faults import maybe_crash
from airflow_backfill.engine.feed_readers import feed_reader_properties
from airflow_backfill.engine.job_state import PHASE_SNAPSHOT, state_dir
from airflow_backfill.engine.planning import aggregate_sql
from airflow_backfill.engine.sizes import sizes
from airflow_backfill.storage import files
from airflow_backfill.storage.uri import join

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from airflow_backfill.engine.delta.commits import CommitInfo
    from airflow_backfill.engine.planning.query import QueryPlan
    from airflow_backfill.job import BackfillJob

log = logging.getLogger(__name__)

_PARTIALS = "__airflow_backfill_partials"
PARTIALS_TABLE = "snapshot_partials"


def partials_uri(target: str) -> str:
    """Where an aggregate snapshot's chunks append their partial states."""
    return join(state_dir(target), PARTIALS_TABLE)


def discard_partials(target: str) -> None:
    files.delete(partials_uri(target))


def chunk_query(plan: QueryPlan) -> str:
    """What a snapshot chunk computes: the query's rows, or an aggregate's partial state."""
    if plan.aggregate is None:
        return plan.query
    return aggregate_sql.state_sql(plan.aggregate, partial=True)


def commit_aggregate_snapshot(
    spark: SparkSession, job: BackfillJob, plan: QueryPlan, upstream_struct: StructType, mv_schema: StructType,
    info: CommitInfo, partials: DataFrame | None = None,
) -> int:
    """Create the state table and the MV at the snapshot's epoch (`upstream_struct`: the
    schema of the query's `source`); returns the MV's rows. `partials`: the partial state
    of a snapshot's only chunk, combined directly instead of from the partials table."""
    aggregate = plan.aggregate
    if aggregate is None:
        raise TypeError("an aggregate plan is required")
    state_schema = analyse(spark, upstream_struct, aggregate_sql.state_sql(aggregate))
    # Cached and counted first: the state and the MV are then written side by side from the
    # same rows (`commit_after`), the MV committing after the state.
    state = cast_to(_combine(spark, plan, upstream_struct, job.target, partials), state_schema).cache()
    mv_rows = None
    try:
        if discard_state(job.target):
            log.info("a previous snapshot attempt stopped before creating the MV; its state was discarded")
        _discard_uncommitted_mv_files(job.target)
        maybe_crash(PHASE_SNAPSHOT, "after_write")
        groups = state.count()
        mv_rows = visible_rows(spark, aggregate, state, value_types(spark, aggregate, upstream_struct), mv_schema)
        if aggregate.having is None:
            rows = groups  # one MV row per group
        else:
            mv_rows = mv_rows.cache()
            rows = mv_rows.count()
        mv_info = replace(info, rows=rows, extra={**info.extra, "groups": str(groups)})
        frame = mv_rows
        # A small MV's rounds hold it whole and rewrite it as one file: its layout stays Spark's.
        layout = plan.mv_key if rows > sizes().held_table_rows else ()

        def write_state() -> None:
            append(state.coalesce(info.parallelism), state_uri(job.target), app_id=job.app_id, version=info.epoch,
                   user_metadata=info.user_metadata(job), create=True)

        def write_mv(before_commit: Callable[[], None]) -> None:
            append(frame.coalesce(info.parallelism), job.target, app_id=job.app_id, version=info.epoch,
                   user_metadata=mv_info.user_metadata(job), create=True, before_commit=before_commit,
                   table_properties=feed_reader_properties(job), laid_out_by=layout)

        commit_after(write_state, write_mv, lambda: maybe_crash(PHASE_SNAPSHOT, "after_state_commit"))
    finally:
        if mv_rows is not None:
            mv_rows.unpersist()
        state.unpersist()
    discard_partials(job.target)  # the partials are in the state now
    log.info("created aggregate MV %s at epoch %s: %s groups, %s rows", job.target, info.epoch, groups, rows)
    return rows


def _discard_uncommitted_mv_files(target: str) -> None:
    """Delete the MV's data files and its empty log that a stopped attempt wrote beside its
    state without committing them (the MV's files are written while the state commits);
    nothing when a Delta table is there, and nothing but those."""
    if table_exists(target):
        return
    leftovers = [name for name in files.list_names(target) if name.endswith(".parquet") or name == "_delta_log"]
    for name in leftovers:
        files.delete(join(target, name))
    if leftovers:
        log.info("removed %s files a stopped snapshot wrote to %s without committing them", len(leftovers), target)


def _combine(spark: SparkSession, plan: QueryPlan, upstream: StructType, target: str,
             partials: DataFrame | None = None) -> DataFrame:
    """The whole upstream's state from the chunks' partial states (`partials`, else the
    partials table)."""
    aggregate = plan.aggregate
    assert aggregate is not None
    if partials is None:
        uri = partials_uri(target)
        partials = spark.read.format("delta").load(uri) if table_exists(uri) \
            else spark.createDataFrame([], analyse(spark, upstream, chunk_query(plan)))
    partials.createOrReplaceTempView(_PARTIALS)
    return spark.sql(aggregate_sql.combine_sql(aggregate, _PARTIALS))
