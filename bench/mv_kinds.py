"""Which kind an MV of a job folder is, as the benchmark reports its figures per kind.

A join reads several upstreams (`sources`); an MV over an MV reads another job's target;
the others are aggregates (the planner finds a GROUP BY or an aggregate) or stateless.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

STATELESS, AGGREGATE, OVER_MV, JOIN = "stateless", "aggregate", "over_mv", "join"
KINDS = (STATELESS, AGGREGATE, OVER_MV, JOIN)


def mv_kind(job: dict[str, Any], jobs: Sequence[dict[str, Any]]) -> str:
    if "sources" in job:
        return JOIN
    if job["source"] in {other["target"] for other in jobs}:
        return OVER_MV
    return AGGREGATE if mv_key_and_aggregate(job)[1] else STATELESS


def mv_key_and_aggregate(job: dict[str, Any]) -> tuple[tuple[str, ...], bool]:
    """The MV's key and whether its query aggregates, as the engine's planner reads them."""
    from airflow_backfill.engine.planning.query import plan_query

    plan = plan_query(job["query"], tuple(job["primary_key"]))
    return tuple(plan.mv_key), plan.aggregate is not None


def kinds_of(jobs: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Job name -> kind."""
    return {job["name"]: mv_kind(job, jobs) for job in jobs}


def source_job(job: dict[str, Any], jobs: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The job whose MV `job` reads, for an MV over an MV."""
    return next((other for other in jobs if other["target"] == job.get("source")), None)
