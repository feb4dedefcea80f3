"""Catch-up and forward rounds of a join MV, counted in sums of upstream versions.

A round's target is a vector: every upstream's latest version, or, under the round
bounds, as many epochs as the bounds allow, taken one epoch at a time from each upstream
in turn, the furthest behind first (so no upstream waits for another's backlog). `max_round_epochs` caps the
epochs of all upstreams together, `max_round_bytes` their change files together; a
round always takes at least one epoch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from airflow_backfill.engine.delta.change_feed import aligned_end, change_bytes, last_multiple
from airflow_backfill.engine.delta.log import (
    arrow_schema,
    check_upstream,
    open_upstream,
    warn_if_rarely_checkpointed,
)
from airflow_backfill.engine.joins.apply import apply_join_round, current_vector
from airflow_backfill.engine.joins.relation import upstream_uri
from airflow_backfill.engine.joins.watermarks import Vector, latest_vector, seconds_behind, vector_sum
from airflow_backfill.engine.planning.join_query import JoinPlan, plan_join
from airflow_backfill.engine.rounds.compact import compact_written

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_backfill.engine.control import BackfillSettings
    from airflow_backfill.engine.rounds.applied import AppliedRange
    from airflow_backfill.job import BackfillJob


def join_plan(job: BackfillJob, versions: Mapping[str, int] | None = None) -> JoinPlan:
    """The job's join plan, with each upstream's columns read from its Delta log (as of
    `versions`, else the latest): no Spark."""
    columns = {
        upstream.name: arrow_schema(open_upstream(upstream.table, None if versions is None else versions[upstream.name]))
        .names for upstream in job.upstreams
    }
    return plan_join(job.query, [(u.name, u.primary_key) for u in job.upstreams], columns)


def check_upstreams(job: BackfillJob, versions: Mapping[str, int] | None = None) -> Vector:
    """Check every upstream (exists, change feed on, readable at its version); their versions."""
    return {u.name: check_upstream(u.table, None if versions is None else versions[u.name]).version
            for u in job.upstreams}


def join_rounds(job: BackfillJob, *, warn: bool = False) -> JoinRounds:
    check_upstreams(job)
    if warn:
        for upstream in job.upstreams:
            warn_if_rarely_checkpointed(upstream.table)
    plan = join_plan(job)
    current_vector(job)  # the MV must exist and its vector match: checked before anything is written
    return JoinRounds(job, plan)


def round_target(job: BackfillJob, watermark: Mapping[str, int], latest: Mapping[str, int], *,
                 max_epochs: int | None, max_bytes: int | None) -> Vector:
    """The vector one round applies up to: `latest`, or less under the bounds (at least
    one epoch further than `watermark` when any upstream is behind); with the job's
    `round_alignment`, each upstream's last multiple of it in its range, when it has one."""
    latest = {name: aligned_end(watermark[name], latest[name], job.round_alignment) for name in watermark}
    target = {name: max(watermark[name], latest[name]) for name in watermark}
    if max_epochs is None and max_bytes is None:
        return target
    target = dict(watermark)
    order = [upstream.name for upstream in job.upstreams]
    epochs = size = 0
    while True:
        moved = False
        behind = sorted((name for name in order if target[name] < latest[name]),
                        key=lambda name: (target[name] - latest[name], order.index(name)))
        for name in behind:
            cost = change_bytes(upstream_uri(job, name), target[name] + 1) if max_bytes is not None else 0
            over = (max_epochs is not None and epochs + 1 > max_epochs) or (
                max_bytes is not None and size + cost > max_bytes)
            if over and epochs:
                return target
            target[name] += 1
            epochs, size, moved = epochs + 1, size + cost, True
        if not moved:
            return target


class JoinRounds:
    """`phases.rounds.Rounds` for a join: watermark and latest epoch are vector sums."""

    def __init__(self, job: BackfillJob, plan: JoinPlan) -> None:
        self.job = job
        self.plan = plan
        self._planned: Vector | None = None

    def watermark(self) -> int:
        return vector_sum(current_vector(self.job))

    def latest(self) -> int:
        self._planned = latest_vector(self.job)
        return vector_sum(self._planned)

    def round_end(self, watermark: int, latest: int, settings: BackfillSettings) -> int:
        latest_versions = self._planned if self._planned is not None else latest_vector(self.job)
        self._planned = round_target(self.job, current_vector(self.job), latest_versions,
                                     max_epochs=settings.max_round_epochs, max_bytes=settings.max_round_bytes)
        return vector_sum(self._planned)

    def forward_end(self, watermark: int, latest: int) -> int:
        """Every upstream's newest version, or with the job's `round_alignment` its last
        multiple of it (its current version until it reaches the next one)."""
        latest_versions = self._planned if self._planned is not None else latest_vector(self.job)
        if self.job.round_alignment is not None:
            current = current_vector(self.job)
            latest_versions = {name: last_multiple(current[name], version, self.job.round_alignment)
                               for name, version in latest_versions.items()}
        self._planned = latest_versions
        return vector_sum(latest_versions)

    def apply(self, spark: SparkSession, end: int, *, phase: str, parallelism: int) -> AppliedRange | None:
        """Apply up to the vector `latest` or `round_end` planned, whose sum is `end`."""
        target = self._planned if self._planned is not None and vector_sum(self._planned) == end \
            else latest_vector(self.job)
        applied = apply_join_round(spark, self.job, self.plan, target, phase=phase, parallelism=parallelism)
        if applied is not None:
            compact_written(spark, [(self.job.target, self.plan.mv_key)])
        return applied

    def seconds_behind(self, watermark: int) -> float:
        return max(seconds_behind(self.job, current_vector(self.job)).values(), default=0.0)
