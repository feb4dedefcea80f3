"""Plan a round from its facts, remember how long it took, and recompute when that is cheaper.

The estimates (`planning/round_plan.py`) start from rates measured on a 2-core machine
and are corrected by this job's own rounds: each round's plan, its estimate and its
duration are kept in the job's state file, and later rounds scale each plan's estimate
by how far its recent rounds were off. They count what the MV's change feed costs the
jobs registered as reading it (`engine/downstream.py`), and what a plan's first round in
this process costs beyond its warm figure (`rounds/warmth.py`). The job's `round_plan`
can pin the choice.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from airflow_backfill.engine import job_state
from airflow_backfill.engine.delta.change_feed import (
    change_bytes,
    change_file_rows,
    logged_change_rows,
    range_inserts_rows,
)
from airflow_backfill.engine.delta.driver_feed import ChangeKeyRange, change_key_range, range_files
from airflow_backfill.engine.delta.key_range import (
    KeyRange,
    all_above,
    rows_in_range,
    table_key_max,
    table_rows,
)
from airflow_backfill.engine.delta.log import DELETION_VECTORS_PROPERTY, load_table
from airflow_backfill.engine.delta.log_state import table_state
from airflow_backfill.engine.downstream import feed_readers_count
from airflow_backfill.engine.planning.round_plan import (
    AUTO,
    DIFFERENCE,
    INCREMENTAL,
    JOIN_ROUND,
    OBSERVATIONS_KEPT,
    RECOMPUTE,
    Rates,
    RoundFacts,
    RoundPlan,
    TableFacts,
    before_the_feed,
    bounded_correction,
    cheapest,
    choose,
    correction_for,
    corrections,
    join_before_the_feed,
    join_recompute_writes,
    observation,
    recompute_before_the_feed,
    recompute_saves,
    with_first_use,
    with_readers,
)
from airflow_backfill.engine.rounds.warmth import mark_run, plans_run
from airflow_backfill.engine.sizes import sizes

if TYPE_CHECKING:
    from airflow_backfill.engine.rounds.write import PreparedChanges
    from airflow_backfill.job import BackfillJob

log = logging.getLogger(__name__)

ROUND_COSTS = "round_costs"
"""The state file's list of recent rounds: plan, estimate and seconds (see `observation`)."""
SNAPSHOT_UPSTREAM_ROWS, SNAPSHOT_PARALLELISM = "snapshot_upstream_rows", "snapshot_parallelism"
"""The state file's rows of each upstream a join snapshot read and its parallelism, beside
its `snapshot_seconds`: how long a recompute of the join took on this machine."""
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
    """The change rows of (watermark, end_version], as known before the feed is read (no row
    read): counted from the log for commits without change files (`logged_change_rows`, a
    deletion vector's rows exactly), from the change files' footers while the range has
    at most `sizes.range_files` of them, else guessed from their bytes and the upstream's
    bytes per row (a small change file's footer and page headers weigh as much as its rows)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    counted, guessed_bytes, footers = 0, 0, 0
    for version in range(watermark + 1, end_version + 1):
        logged = logged_change_rows(source, version)
        if logged is None and footers < sizes().range_files:
            in_files = change_file_rows(source, version)
            if in_files is not None:
                logged, opened = in_files
                footers += opened
        if logged is None:
            guessed_bytes += change_bytes(source, version)
        else:
            counted += logged
    if not guessed_bytes:
        return counted
    actions = pa.table(load_table(source).get_add_actions(flatten=True))
    total_bytes = int(pc.sum(actions.column("size_bytes")).as_py() or 0) if actions.num_rows else 0
    if not rows or not total_bytes:
        return counted
    return counted + int(guessed_bytes * rows / total_bytes)


def readers(job: BackfillJob) -> int:
    """How many jobs read the MV's change feed (`downstream.feed_readers_count`)."""
    return feed_readers_count(job.target)


def keyed_estimates(parallelism: int, feed_readers: int) -> Callable[[PreparedChanges], dict[str, float]]:
    """Each keyed way's seconds for prepared changes of an MV, plus what its feed costs the
    MV's `feed_readers` (`with_readers`)."""
    rates = rates_at(parallelism)

    def estimates(prepared: PreparedChanges) -> dict[str, float]:
        return with_readers(prepared.estimates(rates), prepared.changed.rows or 0, prepared.changed.present_rows,
                            prepared.facts.rows, feed_readers, rates)

    return estimates


def first_use(estimates: Mapping[str, float]) -> dict[str, float]:
    """`estimates` with the first use of each plan this process has not run yet."""
    return with_first_use(estimates, plans_run(), Rates())


def plan_round(job: BackfillJob, estimates: dict[str, float], facts: str) -> RoundPlan:
    """The plan for a round with these estimates (plus the first use of each plan this
    process has not run yet), logged with every alternative and the facts they came from."""
    chosen = choose(first_use(estimates), job_corrections(job), job.round_plan)
    log.info("round plan: %s (%s); estimates %s; %s", chosen.plan, chosen.reason,
             {k: round(v, 2) for k, v in sorted(chosen.estimates.items())}, facts)
    return chosen


def describe(facts: RoundFacts) -> str:
    """A stateless round's facts for the log."""
    return (f"{facts.change_rows} change rows, {facts.changed_keys} keys, {facts.table.touched_rows} of "
            f"{facts.table.rows} MV rows in touched files, upstream {facts.upstream_rows} rows")


def recompute_first(
    job: BackfillJob, watermark: int, end_version: int, parallelism: int, *, aggregate: bool = False,
    keys: tuple[str, str] | None = None,
) -> RoundPlan | None:
    """A recompute plan when it wins before any change row is read: the job asks for it,
    or even the least an incremental round could cost is more than recomputing. For a
    stateless MV, `keys` names the leading key column in the upstream and in the MV: a
    range that inserts no row must then find its keys in the MV's files that the change
    files' key range meets, and the least counts them. With readers of the MV's feed, the
    recompute counts what its feed costs them and may write only the difference
    (`writes`: `mv` `difference`).
    None: read the feed, then plan with what it holds."""
    rates, feed_readers = rates_at(parallelism), readers(job)
    mv_rows = table_rows(job.target) if feed_readers else 0
    rows = table_rows(job.source, end_version)
    if job.round_plan == RECOMPUTE:
        changes = estimated_change_rows(job.source, watermark, end_version, rows) if feed_readers else 0
        ways = recompute_before_the_feed(changes, rows, rates, aggregate=aggregate, prove_key=False,
                                         readers=feed_readers, mv_rows=mv_rows)
        return recompute_writing(RoundPlan(RECOMPUTE, {}, "round_plan: recompute"), ways)
    if job.round_plan != AUTO:
        return None
    changes = estimated_change_rows(job.source, watermark, end_version, rows)
    prove_key = job.verify_primary_key and not aggregate
    inserts = (prove_key or keys is not None) and range_inserts_rows(job.source, watermark, end_version)
    located = None
    if keys is not None and not inserts:
        changed = change_key_range(job.source, watermark, end_version, keys[0])
        if changed is not None:
            changes, located = changed.rows, mv_files_to_search(job.target, keys[1], changed)
    estimates = first_use(before_the_feed(changes, rows, rates, aggregate=aggregate, prove_key=prove_key,
                                          inserts=inserts, located=located, readers=feed_readers, mv_rows=mv_rows,
                                          driver_feed=driver_reads_feed(job.source, watermark, end_version),
                                          patchable=patchable(job.target)))
    recompute = estimates[RECOMPUTE] * correction_for(job_corrections(job), RECOMPUTE)
    if not recompute_saves(recompute, estimates[INCREMENTAL]):
        return None
    ways = recompute_before_the_feed(changes, rows, rates, aggregate=aggregate, prove_key=prove_key, inserts=inserts,
                                     readers=feed_readers, mv_rows=mv_rows)
    return recompute_writing(RoundPlan(
        RECOMPUTE, {RECOMPUTE: recompute}, f"recompute {recompute:.2f} s is below the least an incremental round "
        f"of about {changes} change rows costs ({estimates[INCREMENTAL]:.2f} s)", estimates[RECOMPUTE]), ways)


def driver_reads_feed(source: str, watermark: int, end_version: int) -> bool:
    """Whether the range's feed is of a shape and size the driver reads (`range_files`)."""
    return range_files(source, watermark, end_version, sizes().feed_rows) is not None


def patchable(target: str) -> bool:
    """Whether the MV keeps deletion vectors, so that a patch can write its rounds."""
    state = table_state(target)
    return (state is not None and state.configuration.get(DELETION_VECTORS_PROPERTY) == "true"
            and "deletionVectors" in state.reader_features)


def recompute_writing(plan: RoundPlan, ways: Mapping[str, float]) -> RoundPlan:
    """`plan` (a recompute) writing the MV its cheapest way: an overwrite, as a recompute
    writes without readers, or only the difference (recorded as the MV's write)."""
    way = cheapest(ways)
    return plan.with_writes(mv=way) if way == DIFFERENCE else plan


def mv_files_to_search(target: str, column: str, changed: ChangeKeyRange) -> TableFacts | None:
    """The MV's rows and those of its files whose range of `column` meets the `changed`
    range (from the MV's log: no data read), or None when the key is not integral or a
    date, the types whose statistics are exact."""
    if not all(value is None or _exact_statistic(value) for value in (changed.low, changed.high)):
        return None
    keys = KeyRange(column, changed.low, changed.high, changed.has_nulls, present_rows=0)
    total, touched = rows_in_range(target, column, keys)
    return TableFacts(total, touched, new_keys_only=all_above(keys, table_key_max(target, column)))


def _exact_statistic(value: Any) -> bool:
    """Integers and dates: their file statistics are exact (timestamps shift with zones)."""
    return isinstance(value, int | datetime.date) and not isinstance(value, bool | datetime.datetime)


def join_recompute_first(
    job: BackfillJob, watermark: Mapping[str, int], target: Mapping[str, int], parallelism: int, *,
    aggregate: bool, prove_key: bool,
) -> tuple[RoundPlan | None, float]:
    """For a join round, before any feed is read: a recompute plan when the job asks for one
    or when recomputing the join saves enough over the least its rounds cost, and that
    least (estimated now, what the round's duration corrects later under `JOIN_ROUND`).

    The recompute's estimate is corrected by the job's recompute rounds once there are a
    few, else by its snapshot, which computed the same join (`SNAPSHOT_UPSTREAM_ROWS`):
    the rates alone, measured on wide `lineitem` rows, overestimate narrow dimension
    tables. The least incremental round is corrected by the job's own join rounds.
    """
    rates, feed_readers = rates_at(parallelism), readers(job)
    mv_rows = table_rows(job.target) if feed_readers else 0
    uris = {upstream.name: upstream.table for upstream in job.upstreams}
    rows = {name: table_rows(uris[name], version) for name, version in target.items()}
    changes = sum(estimated_change_rows(uris[name], watermark[name], version, rows[name])
                  for name, version in target.items() if version > watermark[name])
    warm = _join_estimates(rows, changes, rates, aggregate=aggregate, prove_key=prove_key, readers=feed_readers,
                           mv_rows=mv_rows)
    estimates = first_use(warm)
    ways = join_recompute_writes(changes, sum(rows.values()), rates, readers=feed_readers, mv_rows=mv_rows,
                                 proved_rows=_proved_rows(rows, prove_key))
    if job.round_plan == RECOMPUTE:
        return (recompute_writing(RoundPlan(RECOMPUTE, {}, "round_plan: recompute", estimates[RECOMPUTE]), ways),
                warm[INCREMENTAL])
    state = job_state.read_state(job.target)
    learned = corrections(state.get(ROUND_COSTS, []))
    recompute_correction = learned.get(RECOMPUTE) or _snapshot_correction(state, aggregate, prove_key)
    incremental = estimates[INCREMENTAL] * learned.get(JOIN_ROUND, 1.0)
    recompute = estimates[RECOMPUTE] * recompute_correction
    if job.round_plan != AUTO or not recompute_saves(recompute, incremental):
        return None, warm[INCREMENTAL]
    return recompute_writing(RoundPlan(
        RECOMPUTE, {RECOMPUTE: recompute, INCREMENTAL: incremental}, f"recompute {recompute:.2f} s is below the "
        f"least a join round of about {changes} change rows costs ({incremental:.2f} s)", estimates[RECOMPUTE]),
        ways), warm[INCREMENTAL]


def _join_estimates(rows: Mapping[str, int], changes: int, rates: Rates, *, aggregate: bool,
                    prove_key: bool, readers: int = 0, mv_rows: int = 0) -> dict[str, float]:
    return join_before_the_feed(changes, sum(rows.values()), len(rows), rates, aggregate=aggregate,
                                proved_rows=_proved_rows(rows, prove_key), readers=readers, mv_rows=mv_rows)


def _proved_rows(rows: Mapping[str, int], prove_key: bool) -> int:
    """The stateless join's key is proved on its output, about as many rows as its largest upstream."""
    return max(rows.values(), default=0) if prove_key else 0


def _snapshot_correction(state: Mapping[str, Any], aggregate: bool, prove_key: bool) -> float:
    """How the join snapshot's measured seconds compare with the recompute estimate for the
    rows it read at its parallelism (1.0 when the state file does not say: a snapshot
    resumed from earlier chunks, or one taken before it was recorded)."""
    rows, seconds = state.get(SNAPSHOT_UPSTREAM_ROWS), state.get("snapshot_seconds")
    if not isinstance(rows, dict) or not rows or not seconds:
        return 1.0
    rates = rates_at(int(state.get(SNAPSHOT_PARALLELISM) or REFERENCE_PARALLELISM))
    estimate = _join_estimates({str(k): int(v) for k, v in rows.items()}, 0, rates, aggregate=aggregate,
                               prove_key=prove_key)[RECOMPUTE]
    return bounded_correction(float(seconds), estimate)


def record_round(job: BackfillJob, plan: RoundPlan, seconds: float, epoch: int) -> None:
    """Keep the round's plan, estimate and duration for the next rounds' corrections, and
    that this process has run the plan."""
    mark_run(plan)
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
