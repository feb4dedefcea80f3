"""Phase 1, snapshot: the MV query over the upstream as of one pinned epoch.

Spark reads the upstream's files as listed by the Delta log at epoch `E` (never the live
directory, which keeps changing), chunk by chunk, and appends each chunk's output to its
chunk table in one idempotent delta-spark commit (app transaction
`airflow_backfill/<job>/snapshot`, version = chunks committed), so a crash costs at most
the chunk in flight and a rerun skips what the log says is committed. For a stateless
query the chunk table is the MV itself; the snapshot ends with the commit that records
watermark `E`, and until then the MV has no watermark: the sensor, downstream jobs and
the checks treat it as not created. For an aggregate, a chunk's output is the partial
per-group state of its files, appended to a staging table and combined at commit
(`aggregate_snapshot`). The upstream is only read, so it keeps committing meanwhile. An
upstream with deletion vectors (for example another job's MV) is read through Delta as
one chunk, since its files alone are not its rows.

Files are planned in the order of their smallest key (`snapshot_chunks`), so the chunks
of an upstream written in key order cover disjoint key ranges, and so do the MV files
each chunk writes: a round whose changes fall in a key range reads only those files.

The phase's sequence (pin, resume, plan, run, commit) is `snapshot_chunks.skeleton`'s,
shared with joins; this module says what one upstream does its own way (`OneUpstream`):
its epoch, its files as a chunk's rows, and its key proved before the first chunk.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_backfill.engine.delta.key_proof import key_proved_from_files
from airflow_backfill.engine.delta.log import (
    UpstreamInfo,
    check_upstream,
    read_watermark,
    table_exists,
)
from airflow_backfill.engine.delta.vacuumed import check_not_vacuumed
from airflow_backfill.engine.planning.aggregate_sql import quote
from airflow_backfill.engine.planning.query import QueryPlan, plan_query
from airflow_backfill.engine.rounds.changes import apply_query, duplicate_key
from airflow_backfill.engine.rounds.key_check import held_times
from airflow_backfill.engine.snapshot_chunks import skeleton
from airflow_backfill.engine.snapshot_chunks.plan import Chunk, default_chunk_bytes, list_data_files
from airflow_backfill.engine.snapshot_chunks.progress import SnapshotProgress, discard_progress
from airflow_backfill.engine.snapshot_chunks.run import SnapshotResult, discard_uncreated_mv, read_files
from airflow_backfill.engine.snapshot_chunks.skeleton import Committed, Pinned, SnapshotKind
from airflow_backfill.exceptions import RepeatedKeyError, UnsupportedQueryError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

    from airflow_backfill.job import BackfillJob

log = logging.getLogger(__name__)


def run_snapshot(
    spark: SparkSession,
    job: BackfillJob,
    *,
    epoch: int | None = None,
    parallelism: int | None = None,
    chunk_bytes: int | None = None,
    epochs: Mapping[str, int] | None = None,
) -> SnapshotResult:
    """Create the MV as of `epoch` (default: the upstream's latest); a no-op if it exists.

    A join's MV is created as of `epochs`, a version per upstream (default: each one's
    latest), the way `engine/joins/snapshot.py` says. `chunk_bytes`: upstream bytes per
    chunk (default `default_chunk_bytes`: larger for a join, whose chunks each read the
    other upstreams too).
    """
    if chunk_bytes is None:
        chunk_bytes = default_chunk_bytes(job.is_join)
    kind: SnapshotKind[Any]
    if job.is_join:
        from airflow_backfill.engine.joins.snapshot import JoinSnapshot

        kind = JoinSnapshot(spark, job, epochs, parallelism)
    else:
        kind = OneUpstream(spark, job, epoch)
    return skeleton.run(spark, job, kind, parallelism=parallelism, chunk_bytes=chunk_bytes)


class OneUpstream(SnapshotKind[UpstreamInfo]):
    """A snapshot of one upstream at one epoch, whose key is proved before the first chunk."""

    def __init__(self, spark: SparkSession, job: BackfillJob, epoch: int | None) -> None:
        self.spark, self.job, self.epoch = spark, job, epoch
        self.plan = plan_query(job.query, job.primary_key)

    def check(self) -> None:
        check_upstream(self.job.source, key=self.job.primary_key)

    def committed(self) -> Committed | None:
        existing = read_watermark(self.job.target, self.job.app_id)
        return None if existing is None else Committed(existing)

    def resume(self, progress: SnapshotProgress) -> UpstreamInfo:
        if self.epoch is not None and self.epoch != progress.epoch:
            log.info("resuming the unfinished snapshot at epoch %s instead of starting one at %s; "
                     "catch-up covers the epochs in between", progress.epoch, self.epoch)
        return _readable(check_upstream(self.job.source, progress.epoch))

    def pin(self) -> UpstreamInfo:
        return _readable(check_upstream(self.job.source, self.epoch))

    def upstreams(self, pin: UpstreamInfo) -> Pinned:
        from pyspark.sql.pandas.types import from_arrow_schema

        return Pinned(
            epoch=pin.version, plan=self.plan, upstreams={self.job.source: pin}, chunked=self.job.source,
            chunk_key=self.plan.upstream_key[0], source=from_arrow_schema(pin.schema),
            schema=mv_schema(self.spark, pin, self.plan),
            rows=lambda chunk, several: read_files(self.spark, pin, chunk),
        )

    def prove_key_first(self, pinned: Pinned, progress: SnapshotProgress | None) -> bool:
        if progress is not None and progress.key_proved:
            log.info("key proved unique at epoch %s by the run that planned this snapshot", pinned.epoch)
            return True
        return _prove_key(self.spark, self.job, self.plan, pinned.chunked_upstream)


def _readable(upstream: UpstreamInfo) -> UpstreamInfo:
    """`upstream` once its version is known to be whole (no file of it vacuumed)."""
    check_not_vacuumed(upstream.uri, upstream.version)
    return upstream


def mv_schema(spark: SparkSession, upstream: UpstreamInfo, plan: QueryPlan) -> StructType:
    """The MV's schema, from Spark's analysis of the query (errors surface before any write)."""
    from pyspark.errors import AnalysisException
    from pyspark.sql.pandas.types import from_arrow_schema

    empty = spark.createDataFrame([], from_arrow_schema(upstream.schema))
    try:
        return apply_query(spark, empty, plan.query).schema
    except AnalysisException as error:
        raise UnsupportedQueryError(f"Spark cannot analyse the query over the upstream: {error}") from None


def _prove_key(spark: SparkSession, job: BackfillJob, plan: QueryPlan, upstream: UpstreamInfo) -> bool:
    """Refuse an upstream whose key is not unique at the pinned epoch, before any chunk is
    written; True when the key was proved. A stateless MV's key is the upstream's: a
    repeated key would become two MV rows, or, when the WHERE leaves one of them out, make
    later rounds net two upstream rows as one.

    The upstream's key columns are proved rather than the MV's, so that a second row which
    the query's WHERE leaves out is seen too. An aggregate's key is its groups: nothing to
    prove.
    """
    if plan.aggregate is not None:
        return False
    if not job.verify_primary_key:
        log.info("primary-key uniqueness not verified (verify_primary_key: false)")
        return False
    repeated = _upstream_key_repeated(spark, plan, upstream)
    if repeated is not None:
        if table_exists(job.target):
            discard_uncreated_mv(job.target)  # the chunks of an earlier, unproved attempt
        discard_progress(job.target)
        raise RepeatedKeyError(list(job.primary_key), job.source, repeated)
    return True


def _upstream_key_repeated(spark: SparkSession, plan: QueryPlan, upstream: UpstreamInfo) -> str | None:
    """Which upstream key the pinned epoch holds twice, if any: none when the files prove
    the key unique on the driver (`key_proved_from_files`), else counted by Spark over
    every file's key columns."""
    from pyspark.sql import functions as F

    if key_proved_from_files(upstream.uri, upstream.version, plan.upstream_key):
        return None
    every_file = Chunk(0, tuple(list_data_files(upstream.uri, upstream.version)))
    if not every_file.files:
        return None  # an empty upstream
    keys = read_files(spark, upstream, every_file).select(*(F.col(quote(column)) for column in plan.upstream_key))
    duplicate = duplicate_key(keys, plan.upstream_key)
    return None if duplicate is None else held_times(*duplicate, upstream.version)
