"""What catch-up and forward need from a job's upstreams, for one upstream or a join.

Both phases count in one number per MV: its watermark and its upstream's latest epoch,
whose difference is the lag. For one upstream these are Delta versions; for a join
(`engine/joins/rounds.py`) they are the sums of its upstreams' versions, which is the
number its app transaction records, so the lag is the sum of the upstreams' lags and a
round that moves any upstream moves it. `rounds_for` plans the job's query and checks
its upstreams before any round, so bad input fails before anything is written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from airflow_backfill.engine.delta.change_feed import last_multiple, round_end
from airflow_backfill.engine.delta.log import (
    check_upstream,
    commit_timestamp,
    latest_version,
    warn_if_rarely_checkpointed,
    written_by_a_job,
)
from airflow_backfill.engine.phases.apply import apply_epochs
from airflow_backfill.engine.planning.query import QueryPlan, plan_query
from airflow_backfill.engine.rounds.applied import AppliedRange, current_watermark

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_backfill.engine.control import BackfillSettings
    from airflow_backfill.job import BackfillJob


class Rounds(Protocol):
    """The upstream side of catch-up and forward rounds."""

    def watermark(self) -> int:
        """The MV's watermark (an error when the MV does not exist)."""

    def latest(self) -> int:
        """The upstream's latest epoch, on the watermark's scale."""

    def round_end(self, watermark: int, latest: int, settings: BackfillSettings) -> int:
        """Where the next catch-up round ends under the round bounds (at least one epoch
        further; with the job's `round_alignment`, at the range's last multiple of it)."""

    def forward_end(self, watermark: int, latest: int) -> int:
        """Where the next forward round ends: `latest`, or with the job's `round_alignment`
        the last multiple of it (the watermark itself while the upstream has not reached
        the next one: forward then commits only at multiples, as every MV aligned alike)."""

    def apply(self, spark: SparkSession, end: int, *, phase: str, parallelism: int) -> AppliedRange | None:
        """Apply the epochs up to `end` in one round (None when there was nothing to apply)."""

    def seconds_behind(self, watermark: int) -> float:
        """How far the MV at `watermark` trails the upstream's newest commit, in seconds."""


class UpstreamRounds:
    """Rounds over one upstream: its versions are the epochs."""

    def __init__(self, job: BackfillJob, plan: QueryPlan) -> None:
        self.job = job
        self.plan = plan
        self._source_is_mv: bool | None = None

    def watermark(self) -> int:
        return current_watermark(self.job)

    def latest(self) -> int:
        return latest_version(self.job.source)

    def round_end(self, watermark: int, latest: int, settings: BackfillSettings) -> int:
        return round_end(self.job.source, watermark, latest, max_epochs=settings.max_round_epochs,
                         max_bytes=settings.max_round_bytes, alignment=self.job.round_alignment)

    def forward_end(self, watermark: int, latest: int) -> int:
        if self.job.round_alignment is None or self._over_an_mv():  # an MV's versions are its own epochs
            return latest
        return last_multiple(watermark, latest, self.job.round_alignment)

    def _over_an_mv(self) -> bool:
        if self._source_is_mv is None:
            self._source_is_mv = written_by_a_job(self.job.source)
        return self._source_is_mv

    def apply(self, spark: SparkSession, end: int, *, phase: str, parallelism: int) -> AppliedRange | None:
        return apply_epochs(spark, self.job, self.plan, end, phase=phase, parallelism=parallelism)

    def seconds_behind(self, watermark: int) -> float:
        newest = commit_timestamp(self.job.source, latest_version(self.job.source))
        applied = commit_timestamp(self.job.source, watermark)
        if newest is None or applied is None:
            return 0.0
        return max(0.0, (newest - applied) / 1000.0)


def rounds_for(job: BackfillJob, *, warn: bool = False) -> Rounds:
    """The job's rounds, after planning its query and checking its upstreams and its MV
    (`warn`: also warn about upstream logs that are rarely checkpointed)."""
    if job.is_join:
        from airflow_backfill.engine.joins.rounds import join_rounds

        return join_rounds(job, warn=warn)
    plan = plan_query(job.query, job.primary_key)
    check_upstream(job.source, key=job.primary_key)
    if warn:
        warn_if_rarely_checkpointed(job.source)
    current_watermark(job)  # the MV must exist: checked before anything is written
    return UpstreamRounds(job, plan)


def applied_versions(job: BackfillJob) -> list[tuple[str, int]]:
    """(URI, version the MV reflects) of each upstream, once the upstreams are checked and
    the MV found (the errors of `rounds_for`)."""
    if job.is_join:
        from airflow_backfill.engine.joins.apply import current_vector
        from airflow_backfill.engine.joins.rounds import check_upstreams

        check_upstreams(job)
        vector = current_vector(job)
        return [(upstream.table, vector[upstream.name]) for upstream in job.upstreams]
    check_upstream(job.source, key=job.primary_key)
    return [(job.source, current_watermark(job))]
