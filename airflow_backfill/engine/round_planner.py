"""Plan a round from its facts, remember how long it took, and recompute when that is cheaper.

The estimates (`planning/round_plan.py`) start from rates measured on a 2-core machine
and are corrected by this job's own rounds: each round's plan, its estimate and its
duration are kept in the job's state file, and later rounds scale each plan's estimate
by how far its recent rounds were off. The job's `round_plan` can pin the choice.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from airflow_backfill.engine import job_state
from airflow_backfill.engine.delta.change_feed import change_bytes, range_inserts_rows
from airflow_backfill.engine.delta.key_range import table_rows
from airflow_backfill.engine.delta.log import load_table
from airflow_backfill.engine.planning.round_plan import (
    AUTO,
    INCREMENTAL,
    OBSERVATIONS_KEPT,
    RECOMPUTE,
    Rates,
    RoundFacts,
    RoundPlan,
    before_the_feed,
    choose,
    corrections,
    observation,
    recompute_saves,
)

if TYPE_CHECKING:
    from airflow_backfill.engine.delta.keyed_writes import PreparedChanges
    from airflow_backfill.job import BackfillJob

log = logging.getLogger(__name__)

ROUND_COSTS = "round_costs"
"""The state file's list of recent rounds: plan, estimate and seconds (see `observation`)."""
REFERENCE_PARALLELISM = 2
"""The parallelism the default rates were measured at."""


def rates_at(parallelism: int) -> Rates:
    """The default rates with their per-row parts scaled to `parallelism` (fixed costs stay)."""
    scale = REFERENCE_PARALLELISM / max(1, parallelism)
    base = Rates()
    return replace(base, **{name: getattr(base, name) * scale for name in (
        "per_change_row", "per_written_row", "per_read_row", "per_key", "per_scanned_row", "per_merged_row",
        "per_upstream_row")})


def job_corrections(job: BackfillJob) -> dict[str, float]:
    return corrections(job_state.read_state(job.target).get(ROUND_COSTS, []))


def estimated_change_rows(source: str, watermark: int, end_version: int, rows: int) -> int:
    """The change rows of (watermark, end_version], guessed from the bytes of its change files
    and the upstream's bytes per row (no data read): what the plan knows before the feed."""
    import pyarrow as pa
    import pyarrow.compute as pc

    actions = pa.table(load_table(source).get_add_actions(flatten=True))
    total_bytes = int(pc.sum(actions.column("size_bytes")).as_py() or 0) if actions.num_rows else 0
    if not rows or not total_bytes:
        return 0
    feed_bytes = sum(change_bytes(source, version) for version in range(watermark + 1, end_version + 1))
    return int(feed_bytes * rows / total_bytes)


def plan_round(job: BackfillJob, estimates: dict[str, float], facts: str) -> RoundPlan:
    """The plan for a round with these estimates, logged with every alternative and the
    facts they came from."""
    chosen = choose(estimates, job_corrections(job), job.round_plan)
    log.info("round plan: %s (%s); estimates %s; %s", chosen.plan, chosen.reason,
             {k: round(v, 2) for k, v in sorted(chosen.estimates.items())}, facts)
    return chosen


def describe(facts: RoundFacts) -> str:
    """A stateless round's facts for the log."""
    return (f"{facts.change_rows} change rows, {facts.changed_keys} keys, {facts.table.touched_rows} of "
            f"{facts.table.rows} MV rows in touched files, upstream {facts.upstream_rows} rows")


def recompute_first(
    job: BackfillJob, watermark: int, end_version: int, parallelism: int, *, aggregate: bool = False,
) -> RoundPlan | None:
    """A recompute plan when it wins before any change row is read: the job asks for it,
    or even a round whose writes cost nothing would cost more than recomputing.
    None: read the feed, then plan with what it holds."""
    if job.round_plan == RECOMPUTE:
        return RoundPlan(RECOMPUTE, {}, "round_plan: recompute")
    if job.round_plan != AUTO:
        return None
    rows = table_rows(job.source, end_version)
    changes = estimated_change_rows(job.source, watermark, end_version, rows)
    prove_key = job.verify_primary_key and not aggregate
    estimates = before_the_feed(changes, rows, rates_at(parallelism), aggregate=aggregate, prove_key=prove_key,
                                inserts=prove_key and range_inserts_rows(job.source, watermark, end_version))
    recompute = estimates[RECOMPUTE] * job_corrections(job).get(RECOMPUTE, 1.0)
    if not recompute_saves(recompute, estimates[INCREMENTAL]):
        return None
    return RoundPlan(RECOMPUTE, {RECOMPUTE: recompute}, f"recompute {recompute:.2f} s is below the least an "
                     f"incremental round of about {changes} change rows costs ({estimates[INCREMENTAL]:.2f} s)",
                     estimates[RECOMPUTE])


def record_round(job: BackfillJob, plan: RoundPlan, seconds: float, epoch: int) -> None:
    """Keep the round's plan, estimate and duration for the next rounds' corrections."""
    if not plan.base_estimate:
        return
    kept: list[dict[str, Any]] = list(job_state.read_state(job.target).get(ROUND_COSTS, []))
    kept.append(observation(plan, seconds, epoch))
    job_state.update_state(job.target, **{ROUND_COSTS: kept[-OBSERVATIONS_KEPT:]})


def stateless_facts(prepared: PreparedChanges, change_rows: int, rows_upstream: int, verify: bool) -> RoundFacts:
    """A stateless round's facts from its prepared MV changes."""
    return RoundFacts(
        change_rows=change_rows, changed_keys=prepared.changed.rows or 0,
        present_rows=prepared.changed.present_rows, table=prepared.facts, upstream_rows=rows_upstream,
        feed_needed_for_recompute=verify,
    )
