"""Snapshot commit of an aggregate MV: combine the chunks' partial states, then create
the state table and the MV.

Each snapshot chunk writes the *partial* state of its files (`aggregate_sql.state_sql`
with `partial=True`), so chunks stay the resumable unit of the snapshot exactly as for
a stateless query. At commit the partials are combined per group (counts and sums
added, MIN of MINs, MAX of MAXes, the union of COUNT(DISTINCT) value sets counted), the
state table is created at the pinned epoch, and the MV's rows are computed from it and
committed at the same epoch. The state goes first: a crash between the two leaves a
state without MV, which the rerun discards and rebuilds from the (still recorded)
chunk partials.
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from typing import TYPE_CHECKING

from airflow_backfill.engine import aggregate_sql
from airflow_backfill.engine.aggregate_state import create_state, discard_state, state_uri
from airflow_backfill.engine.aggregate_view import analyse, cast_to, value_types, visible_rows
from airflow_backfill.engine.faults import maybe_crash
from airflow_backfill.engine.job_state import PHASE_SNAPSHOT
from airflow_backfill.engine.mv_commit import CommitInfo, add_actions_for, create_mv
from airflow_backfill.engine.snapshot_progress import epoch_dir

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from airflow_backfill.engine.delta_log import UpstreamInfo
    from airflow_backfill.engine.query import QueryPlan
    from airflow_backfill.engine.snapshot_progress import SnapshotProgress
    from airflow_backfill.job import BackfillJob

log = logging.getLogger(__name__)

_PARTIALS = "__airflow_backfill_partials"


def chunk_query(plan: QueryPlan) -> str:
    """What a snapshot chunk computes: the query's rows, or an aggregate's partial state."""
    if plan.aggregate is None:
        return plan.query
    return aggregate_sql.state_sql(plan.aggregate, partial=True)


def commit_aggregate_snapshot(
    spark: SparkSession, job: BackfillJob, plan: QueryPlan, progress: SnapshotProgress,
    upstream: UpstreamInfo, mv_schema: StructType, info: CommitInfo,
) -> int:
    """Create the state table and the MV at the snapshot's epoch; returns the MV's rows."""
    from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

    aggregate = plan.aggregate
    if aggregate is None:
        raise TypeError("an aggregate plan is required")
    upstream_struct = from_arrow_schema(upstream.schema)
    chunk_dirs = [os.path.join(job.target, progress.done[i].data_dir) for i in sorted(progress.done)]
    state_schema = analyse(spark, upstream_struct, aggregate_sql.state_sql(aggregate))
    combined = _combine(spark, plan, upstream_struct, chunk_dirs)
    if discard_state(job.target):
        log.info("a previous snapshot attempt stopped between its two commits; its state was discarded")
    run_id = uuid.uuid4().hex[:12]
    state_dir = os.path.join(state_uri(job.target), f"snapshot-e{progress.epoch}-{run_id}")
    cast_to(combined, state_schema).coalesce(info.parallelism).write.parquet(state_dir)
    state = spark.read.schema(state_schema).parquet(state_dir)
    types = value_types(spark, aggregate, upstream_struct)
    mv_dir = os.path.join(epoch_dir(job.target, progress.epoch), f"final-{run_id}")
    visible_rows(spark, aggregate, state, types, mv_schema).coalesce(info.parallelism).write.parquet(mv_dir)
    actions, rows = add_actions_for(job.target, mv_dir)
    maybe_crash(PHASE_SNAPSHOT, "after_write")
    groups = create_state(job, to_arrow_schema(state_schema, timezone="UTC"), state_dir, info)
    maybe_crash(PHASE_SNAPSHOT, "after_state_commit")
    mv_info = CommitInfo(phase=info.phase, epoch=info.epoch, parallelism=info.parallelism, rows=rows,
                         extra={**info.extra, "groups": str(groups)})
    create_mv(job, to_arrow_schema(mv_schema, timezone="UTC"), actions, mv_info)
    for chunk_dir in chunk_dirs:  # the partials are in the state now
        shutil.rmtree(chunk_dir, ignore_errors=True)
    return rows


def _combine(spark: SparkSession, plan: QueryPlan, upstream: StructType, chunk_dirs: list[str]) -> DataFrame:
    """The whole upstream's state from the chunks' partial states."""
    aggregate = plan.aggregate
    assert aggregate is not None
    partial_schema = analyse(spark, upstream, chunk_query(plan))
    if chunk_dirs:
        partials = spark.read.schema(partial_schema).parquet(*chunk_dirs)
    else:
        partials = spark.createDataFrame([], partial_schema)
    partials.createOrReplaceTempView(_PARTIALS)
    return spark.sql(aggregate_sql.combine_sql(aggregate, _PARTIALS))
