"""The benchmark sections that need Spark. Each runs inside a child process whose
SparkSession is `local[N]` at the parallelism the section measures (see bench/child.py).

Every function returns plain JSON-ready data; the parent process computes nothing but
the ratios that combine two children's figures (the scaling speed-up).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bench.measure import MemorySampler, PhaseTimer, median, percentile, stopwatch, without_cached_states
from bench.workload import (
    LOADED_EPOCH,
    QUERIES,
    Workspace,
    freshness_latencies,
    lineitem_job,
    plain_recompute,
    plain_spark_job,
    query_support,
    upstream_files,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_backfill.tpch import TpchTables

log = logging.getLogger("bench")

MV_NAME = "bench_lineitem_mv"
"""The long-lived MV that catch-up creates and forward keeps fresh."""
SNAPSHOT_STEPS = ("mv_schema", "_run_chunk", "_prove_key", "commit_watermark_only")
"""Engine snapshot steps timed separately to say where the time goes."""
APPLY_STEPS = ("check_schema_unchanged", "_prove_upstream_key", "prepare", "write", "recompute_stateless",
               "recompute_aggregate")
"""Steps of one catch-up round or forward commit timed separately (engine/phases/apply.py, and
engine/aggregates/apply.py for an aggregate's state and MV): the log checks; `prepare`, which
holds the keyed changes in memory (netting and mapping them) and reads the facts the plan
needs; `write`, the commit in the way the plan chose (with the watermark); a recompute, and
the proof of the upstream's key when a recompute skips the feed. The rest of `apply_epochs` is Spark reading the change feed (and counting it for the commit's
metadata) and planning."""


@dataclass(frozen=True)
class SectionSettings:
    """What the parent asks a child to measure."""

    workspace: Workspace
    parallelism: int
    repeats: int
    seed: int
    freshness_epochs: int
    epoch_interval: float
    poll_interval: float
    memory: MemorySampler
    """The child's sampler, for peaks of single measured calls inside a section."""
    quick: bool = False
    """`--quick`: the catch-up section measures fewer cases."""


def snapshot_once(
    spark: SparkSession, settings: SectionSettings, kind: str, timer: PhaseTimer, *, warm_up: bool = False,
    verify_primary_key: bool = True,
) -> dict[str, Any]:
    """One engine snapshot of the `kind` MV at the loaded epoch, into a fresh target."""
    from airflow_backfill.engine.phases import snapshot

    target = settings.workspace.scratch(f"snapshot-{kind}-p{settings.parallelism}")
    job = lineitem_job(settings.workspace, f"bench_snapshot_{kind}", target, QUERIES[kind],
                       warm_up=warm_up, backfill_parallelism=settings.parallelism,
                       verify_primary_key=verify_primary_key)
    with settings.memory.window() as peak, timer.wrapping(snapshot, SNAPSHOT_STEPS), stopwatch() as elapsed:
        result = snapshot.run_snapshot(spark, job, epoch=LOADED_EPOCH, parallelism=settings.parallelism)
    seconds = elapsed()
    shutil.rmtree(target, ignore_errors=True)
    return {"seconds": round(seconds, 3), "rows": result.rows, "steps_s": timer.take(), "memory": peak}


def plain_once(spark: SparkSession, settings: SectionSettings, kind: str, files: list[str]) -> dict[str, Any]:
    out_dir = settings.workspace.scratch(f"plain-{kind}-p{settings.parallelism}")
    with settings.memory.window() as peak, stopwatch() as elapsed:
        plain_spark_job(spark, files, QUERIES[kind], out_dir)
    seconds = elapsed()
    shutil.rmtree(out_dir, ignore_errors=True)
    return {"seconds": round(seconds, 3), "memory": peak}


def snapshot_overhead(spark: SparkSession, settings: SectionSettings) -> dict[str, Any]:
    """Engine snapshot vs the plain Spark job, alternating, for each MV kind the engine takes."""
    files = upstream_files(settings.workspace.tables.lineitem, LOADED_EPOCH)
    result: dict[str, Any] = {"parallelism": settings.parallelism, "repeats": settings.repeats,
                              "upstream_files": len(files)}
    for kind in QUERIES:
        unsupported = query_support(kind)
        if unsupported:
            result[kind] = {"status": unsupported}
            continue
        result[kind] = _compare(spark, settings, kind, files)
    if result.get("stateless", {}).get("status") == "measured":
        # What the primary-key proof costs: the same MV with `verify_primary_key: false`.
        result["stateless_unverified_key"] = _compare(spark, settings, "stateless", files, verify_primary_key=False)
    return result


def warm_up_kind(spark: SparkSession, settings: SectionSettings, kind: str, *, verify_primary_key: bool = True) -> None:
    """One unmeasured run of each side over the small warm-up copy of TPC-H: the first
    run of a code path in a JVM pays for class loading and code generation."""
    snapshot_once(spark, settings, kind, PhaseTimer(), warm_up=True, verify_primary_key=verify_primary_key)
    files = upstream_files(settings.workspace.warm_up_tables.lineitem, LOADED_EPOCH)
    plain_once(spark, settings, kind, files)


def _compare(
    spark: SparkSession, settings: SectionSettings, kind: str, files: list[str], *, verify_primary_key: bool = True
) -> dict[str, Any]:
    warm_up_kind(spark, settings, kind, verify_primary_key=verify_primary_key)
    timer = PhaseTimer()
    engine: list[dict[str, Any]] = []
    plain: list[dict[str, Any]] = []
    for round_number in range(settings.repeats):
        # Alternate which goes first, so warm caches and JIT favour neither side.
        if round_number % 2 == 0:
            engine.append(snapshot_once(spark, settings, kind, timer, verify_primary_key=verify_primary_key))
            plain.append(plain_once(spark, settings, kind, files))
        else:
            plain.append(plain_once(spark, settings, kind, files))
            engine.append(snapshot_once(spark, settings, kind, timer, verify_primary_key=verify_primary_key))
    engine_s = [run["seconds"] for run in engine]
    plain_s = [run["seconds"] for run in plain]
    steps = {step: round(median([run["steps_s"].get(step, 0.0) for run in engine]), 3)
             for step in SNAPSHOT_STEPS}
    steps["other"] = round(median(engine_s) - sum(steps.values()), 3)
    return {
        "status": "measured",
        "rows": engine[-1]["rows"],
        "engine_s": engine_s,
        "plain_s": plain_s,
        "engine_median_s": round(median(engine_s), 3),
        "plain_median_s": round(median(plain_s), 3),
        "ratio": round(median(engine_s) / median(plain_s), 3),
        "engine_steps_median_s": steps,
        "engine_peak_rss_mib": _max_peak(engine),
        "plain_peak_rss_mib": _max_peak(plain),
    }


def _max_peak(runs: list[dict[str, Any]]) -> float | None:
    peaks = [run["memory"].get("peak_rss_mib") for run in runs]
    return max((p for p in peaks if p is not None), default=None)


def scaling(spark: SparkSession, settings: SectionSettings) -> dict[str, Any]:
    """The stateless snapshot at this child's parallelism, `repeats` times, alternating with
    the plain Spark job (whose own speed-up is the ceiling on this machine)."""
    case = _compare(spark, settings, "stateless", upstream_files(settings.workspace.tables.lineitem, LOADED_EPOCH))
    return {"parallelism": settings.parallelism, "snapshot_s": case["engine_s"],
            "snapshot_median_s": case["engine_median_s"], "plain_median_s": case["plain_median_s"],
            "steps_median_s": case["engine_steps_median_s"], "rows": case["rows"],
            "snapshot_peak_rss_mib": case["engine_peak_rss_mib"]}


@contextmanager
def timing_apply(timer: PhaseTimer) -> Iterator[PhaseTimer]:
    """Time `apply_epochs` (as the rounds of catch-up and forward call it) and its steps."""
    from airflow_backfill.engine.aggregates import apply as aggregate_apply
    from airflow_backfill.engine.phases import apply, rounds

    with timer.wrapping(apply, APPLY_STEPS), timer.wrapping(aggregate_apply, APPLY_STEPS), \
            timer.wrapping(rounds, ("apply_epochs",)):
        yield timer


def apply_breakdown(steps: dict[str, float], commits: int = 1) -> dict[str, float]:
    """Seconds per MV commit in each apply step; `spark` is what the named steps leave."""
    total = steps.get("apply_epochs", 0.0)
    named = {step: steps.get(step, 0.0) for step in APPLY_STEPS}
    breakdown = {**named, "spark": total - sum(named.values()), "apply_epochs": total}
    return {step: round(value / max(1, commits), 3) for step, value in breakdown.items()}


def warm_up_apply(spark: SparkSession, settings: SectionSettings, job: Any, *, insert: bool = False) -> None:
    """Apply one tiny upstream change, unmeasured: the first apply in a JVM pays for
    class loading and code generation (seconds), which would otherwise land on the
    first measured figure only. The recompute it is compared with is warm too."""
    from airflow_backfill import tpch
    from airflow_backfill.engine.phases.catch_up import run_catch_up

    if insert:
        tpch.insert_new_orders(settings.workspace.tables, settings.seed, count=1)
    else:
        _update_lineitems_elsewhere(settings.workspace.tables, settings.seed, 1e-9, newest=False)
    run_catch_up(spark, job, parallelism=settings.parallelism)


def catch_up_cost(spark: SparkSession, settings: SectionSettings) -> dict[str, Any]:
    """Catch-up of 10%, 1% and 0.1% updated rows against recomputing the MV from scratch;
    the driver's Python memory of each catch-up too (it must not grow with the change).
    Then 1% of the rows again, those of the newest orders: changes clustered by key, whose
    key range bounds the round's MERGE; then a single updated row. Each case runs
    `repeats` times (medians). `--quick` measures 1% and the single row."""
    from airflow_backfill.engine.phases.snapshot import run_snapshot

    job = _long_lived_job(settings)
    with stopwatch() as elapsed:
        initial = run_snapshot(spark, job, parallelism=settings.parallelism)
    result: dict[str, Any] = {"parallelism": settings.parallelism, "initial_snapshot_s": round(elapsed(), 3),
                              "mv_rows": initial.rows, "mv_files": _file_count(job.target), "shares": {}}
    warm_up_apply(spark, settings, job)
    warm_up_plain(spark, settings, "stateless")
    for share in (0.01,) if settings.quick else (0.1, 0.01, 0.001):
        result["shares"][str(share)] = _repeated_case(spark, settings, job, share)
    if not settings.quick:
        result["newest"] = {"share": NEWEST_SHARE, **_repeated_case(spark, settings, job, NEWEST_SHARE, newest=True)}
    result["one_row"] = _repeated_case(spark, settings, job, ONE_ROW_SHARE)
    return result


def _repeated_case(
    spark: SparkSession, settings: SectionSettings, job: Any, share: float, *, newest: bool = False,
) -> dict[str, Any]:
    """`repeats` runs of one catch-up case, each on a fresh update, alternating which side
    runs first (the first large job of a kind in a JVM also compiles the code the other
    side runs): the median of each time (the speed-ups are those of the medians), the
    highest of each memory peak, every run's plans, and every run as measured under `runs`."""
    runs = [_catch_up_case(spark, settings, job, share, newest=newest, plain_first=run % 2 == 1)
            for run in range(settings.repeats)]
    first = runs[0]
    timed = {name: round(median([run[name] for run in runs]), 3)
             for name in ("catch_up_s", "plain_s", "recompute_s", "upstream_merge_s")}
    peaks = {name: max((run[name] for run in runs if run[name] is not None), default=None)
             for name in ("catch_up_peak_rss_mib", "driver_python_peak_mib", "jvm_peak_mib")}
    return {
        **first, **timed, **peaks,
        "plans": [plan for run in runs for plan in run["plans"]],
        "speedup": round(timed["plain_s"] / timed["catch_up_s"], 3),
        "speedup_vs_snapshot": round(timed["recompute_s"] / timed["catch_up_s"], 3),
        "floor_s": {part: round(median([run["floor_s"][part] for run in runs]), 3) for part in first["floor_s"]},
        "runs": runs,
    }


NEWEST_SHARE = 0.01
"""Share of the line items the key-clustered case updates (those of the newest orders)."""
ONE_ROW_SHARE = 1e-12
"""A share so small that `tpch update` changes a single line item (it updates at least one)."""


def plain_target(settings: SectionSettings, kind: str) -> str:
    """The table the plain recompute overwrites, kept between cases as a user's would be."""
    return os.path.join(settings.workspace.root, "plain", kind)


def timed_plain_recompute(spark: SparkSession, settings: SectionSettings, kind: str, version: int) -> float:
    """Seconds of the plain Spark recompute of the `kind` MV at `version` (the baseline)."""
    without_cached_states(spark)
    with stopwatch() as elapsed:
        plain_recompute(spark, settings.workspace.tables.lineitem, version, QUERIES[kind], plain_target(settings, kind))
    return round(elapsed(), 3)


def warm_up_plain(spark: SparkSession, settings: SectionSettings, kind: str) -> None:
    """One unmeasured plain recompute (over the small warm-up copy): the baseline's first
    run in a JVM compiles its code paths, as the engine's warm-up does for its own."""
    from airflow_backfill.engine.delta.log import latest_version

    tables = settings.workspace.warm_up_tables
    plain_recompute(spark, tables.lineitem, latest_version(tables.lineitem), QUERIES[kind],
                    settings.workspace.scratch(f"plain-warm-up-{kind}"))


def _catch_up_case(
    spark: SparkSession, settings: SectionSettings, job: Any, share: float, *, newest: bool = False,
    plain_first: bool = False,
) -> dict[str, Any]:
    """Update `share` of the line items, catch the MV up, and recompute it at the same version
    (the plain recompute before the catch-up when `plain_first`)."""
    from airflow_backfill.engine.phases.apply import current_watermark
    from airflow_backfill.engine.phases.catch_up import run_catch_up
    from airflow_backfill.engine.phases.snapshot import run_snapshot

    workspace = settings.workspace
    watermark = current_watermark(job)
    with stopwatch() as upstream_elapsed:
        updated, version = _update_lineitems_elsewhere(workspace.tables, settings.seed, share, newest=newest)
    timer = PhaseTimer()
    plain_s = timed_plain_recompute(spark, settings, "stateless", version) if plain_first else 0.0
    without_cached_states(spark)
    with settings.memory.window() as catch_up_peak, timing_apply(timer), stopwatch() as catch_up_elapsed:
        caught_up = run_catch_up(spark, job, parallelism=settings.parallelism)
    steps = apply_breakdown(timer.take(), len(caught_up.rounds))
    if not plain_first:
        plain_s = timed_plain_recompute(spark, settings, "stateless", version)
    recompute_target = workspace.scratch(f"recompute-{share}")
    recompute_job = lineitem_job(workspace, "bench_recompute", recompute_target, QUERIES["stateless"],
                                 backfill_parallelism=settings.parallelism)
    without_cached_states(spark)
    with stopwatch() as recompute_elapsed:
        run_snapshot(spark, recompute_job, epoch=version, parallelism=settings.parallelism)
    shutil.rmtree(recompute_target, ignore_errors=True)
    catch_up_s = round(catch_up_elapsed(), 3)  # the ratio of the figures reported, as a reader recomputes it
    return {
        "plans": [r.plan for r in caught_up.rounds],
        "plain_first": plain_first,
        "plain_s": plain_s,
        "speedup": round(plain_s / catch_up_s, 3),
        "updated_rows": updated,
        "upstream_merge_s": round(upstream_elapsed(), 3),
        "catch_up_s": catch_up_s,
        "catch_up_rounds": len(caught_up.rounds),
        "round_steps_s": steps,
        "catch_up_peak_rss_mib": catch_up_peak.get("peak_rss_mib"),
        "driver_python_start_mib": catch_up_peak.get("start_root_rss_mib"),
        "driver_python_peak_mib": catch_up_peak.get("peak_root_rss_mib"),
        "jvm_peak_mib": catch_up_peak.get("peak_jvm_rss_mib"),
        "change_rows": sum(r.change_rows for r in caught_up.rounds),
        "recompute_s": round(recompute_elapsed(), 3),
        "speedup_vs_snapshot": round(recompute_elapsed() / catch_up_elapsed(), 3),
        "floor_s": round_floor(spark, job, watermark, version),
    }


def _update_lineitems_elsewhere(tables: TpchTables, seed: int, share: float, *, newest: bool) -> tuple[int, int]:
    """`tpch update` in a process of its own: its Arrow work (the table's keys, a delta-rs
    MERGE) would otherwise stay in this process's RSS and hide the catch-up driver's own
    peak behind it. Returns (rows updated, the lineitem version committed)."""
    command = [sys.executable, "-m", "airflow_backfill.tpch", "update", "--root", tables.root,
               "--seed", str(seed), "--share", str(share), *(["--newest"] if newest else [])]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    if finished.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({finished.returncode}): {finished.stderr[-2000:]}")
    outcome = json.loads(finished.stdout.strip().splitlines()[-1])
    return int(outcome["updated"]), int(outcome["lineitem_version"])


def _file_count(uri: str) -> int:
    """The Delta table's data files now (delta-rs reads the log; no Spark job)."""
    from deltalake import DeltaTable

    return len(DeltaTable(uri).file_uris())


def refresh_catch_up(spark: SparkSession, settings: SectionSettings) -> dict[str, Any]:
    """Catch-up of one RF1 + RF2 refresh pair against recomputing the MV, for the Q1
    aggregate MV and for the stateless lineitem MV."""
    return {"parallelism": settings.parallelism,
            **{kind: _refresh_pairs(spark, settings, kind) for kind in ("aggregate", "stateless")}}


def _refresh_pairs(spark: SparkSession, settings: SectionSettings, kind: str) -> dict[str, Any]:
    """Each of `repeats` rounds commits an RF1 (new orders and their line items) and an RF2
    (deleted orders and their line items) to the upstream, catches the `kind` MV up over
    both epochs, and recomputes the MV from scratch at the same version into a new target.
    """
    from airflow_backfill import tpch
    from airflow_backfill.engine.phases.apply import current_watermark
    from airflow_backfill.engine.phases.catch_up import run_catch_up
    from airflow_backfill.engine.phases.snapshot import run_snapshot

    workspace = settings.workspace
    job = lineitem_job(workspace, f"bench_refresh_{kind}", os.path.join(workspace.root, "mv", f"refresh_{kind}"),
                       QUERIES[kind], backfill_parallelism=settings.parallelism, lag_threshold=0)
    with stopwatch() as elapsed:
        initial = run_snapshot(spark, job, parallelism=settings.parallelism)
    # One unmeasured refresh pair, as the recompute gets one unmeasured run below: the
    # first rounds of this size in a JVM still compile their code paths.
    tpch.insert_new_orders(workspace.tables, settings.seed)
    tpch.delete_old_orders(workspace.tables, settings.seed)
    run_catch_up(spark, job, parallelism=settings.parallelism)
    recompute_job = lineitem_job(workspace, f"bench_recompute_{kind}", workspace.scratch(f"recompute-{kind}"),
                                 QUERIES[kind], backfill_parallelism=settings.parallelism)
    run_snapshot(spark, recompute_job, parallelism=settings.parallelism)  # unmeasured warm-up
    shutil.rmtree(recompute_job.target, ignore_errors=True)
    warm_up_plain(spark, settings, kind)
    rounds: list[dict[str, Any]] = []
    for pair in range(settings.repeats):
        watermark = current_watermark(job)
        rf1 = tpch.insert_new_orders(workspace.tables, settings.seed)
        rf2 = tpch.delete_old_orders(workspace.tables, settings.seed)
        timer = PhaseTimer()
        plain_first = pair % 2 == 1  # alternating which side runs first, as the catch-up cases do
        plain_s = timed_plain_recompute(spark, settings, kind, rf2.lineitem_version) if plain_first else 0.0
        without_cached_states(spark)
        with settings.memory.window() as peak, timing_apply(timer), stopwatch() as catch_up_elapsed:
            caught_up = run_catch_up(spark, job, parallelism=settings.parallelism)
        if not plain_first:
            plain_s = timed_plain_recompute(spark, settings, kind, rf2.lineitem_version)
        without_cached_states(spark)
        with stopwatch() as recompute_elapsed:
            run_snapshot(spark, recompute_job, epoch=rf2.lineitem_version, parallelism=settings.parallelism)
        shutil.rmtree(recompute_job.target, ignore_errors=True)
        rounds.append({
            "inserted_lineitems": rf1.lineitems, "deleted_lineitems": rf2.lineitems,
            "change_rows": sum(r.change_rows for r in caught_up.rounds), "plans": [r.plan for r in caught_up.rounds],
            "catch_up_s": round(catch_up_elapsed(), 3), "plain_s": plain_s, "plain_first": plain_first,
            "recompute_s": round(recompute_elapsed(), 3),
            "round_steps_s": apply_breakdown(timer.take(), len(caught_up.rounds)),
            "catch_up_peak_rss_mib": peak.get("peak_rss_mib"),
            "floor_s": round_floor(spark, job, watermark, rf2.lineitem_version),
        })
    catch_up_median = median([r["catch_up_s"] for r in rounds])
    plain_median = median([r["plain_s"] for r in rounds])
    recompute_median = median([r["recompute_s"] for r in rounds])
    floor_median = median([r["floor_s"]["total"] for r in rounds])
    return {
        "initial_snapshot_s": round(elapsed(), 3), "mv_rows": initial.rows, "refresh_pairs": rounds,
        "catch_up_median_s": round(catch_up_median, 3), "plain_median_s": round(plain_median, 3),
        "recompute_median_s": round(recompute_median, 3),
        "speedup": round(plain_median / catch_up_median, 2),
        "speedup_vs_snapshot": round(recompute_median / catch_up_median, 2),
        "floor_median_s": round(floor_median, 3), "ceiling_speedup": round(plain_median / floor_median, 2),
    }


FLOOR_APP_ID = "airflow_backfill-bench/floor"
"""The app transaction of the floor's empty commits: another id than the job's, so the
MV's watermark is never moved by them."""


def round_floor(spark: SparkSession, job: Any, watermark: int, end: int) -> dict[str, float]:
    """The least a round over the epochs (watermark, end] costs on this machine, with none of
    the engine's own work, in seconds:

    - `feed`: Spark reads the range's change feed (the columns the query reads) into memory;
    - `locate` (a stateless MV): the changed keys are found in the MV by reading its key
      columns (only the files within the keys' range), as any round must that updates or
      deletes rows in place without an index of its own;
    - `commits`: the Delta commits a round makes, each an empty one carrying an app
      transaction: one for a stateless MV, two for an aggregate (its state table, then the MV).

    A recompute over this floor bounds the speed-up any such round can reach here.
    """
    from airflow_backfill.engine.aggregates.state import state_uri
    from airflow_backfill.engine.delta.change_feed import read_change_feed
    from airflow_backfill.engine.delta.commits import commit_watermark_only
    from airflow_backfill.engine.delta.log import load_table
    from airflow_backfill.engine.phases.apply import feed_columns
    from airflow_backfill.engine.planning.query import plan_query

    plan = plan_query(job.query, job.primary_key)
    columns = feed_columns(job, plan)
    tables = [job.target] if plan.aggregate is None else [state_uri(job.target), job.target]
    feed = read_change_feed(spark, job.source, watermark, end, columns).cache()
    try:
        with stopwatch() as feed_elapsed:
            feed.count()
        with stopwatch() as locate_elapsed:
            if plan.aggregate is None:
                _locate_keys(spark, feed, job.target, plan.upstream_key, plan.mv_key)
    finally:
        feed.unpersist()
    with stopwatch() as commits_elapsed:
        for uri in tables:
            version = (load_table(uri).transaction_version(FLOOR_APP_ID) or 0) + 1
            commit_watermark_only(spark, uri, app_id=FLOOR_APP_ID, version=version, user_metadata="{}")
    parts = {"feed": feed_elapsed(), "locate": locate_elapsed(), "commits": commits_elapsed()}
    return {**{part: round(seconds, 3) for part, seconds in parts.items()}, "total": round(sum(parts.values()), 3)}


def _locate_keys(spark: SparkSession, feed: Any, target: str, upstream_key: tuple[str, ...],
                 mv_key: tuple[str, ...]) -> int:
    """How many of the feed's keys the MV holds: its key columns read (from the files its
    checksum lists, when it lists them: no state rebuilt) within the keys' leading range
    (Delta skips the files outside it), semi-joined with the keys, on the leading column
    first when the key has several (as the engine's deletes do: Spark probes one integral
    column much faster than several)."""
    from pyspark.sql import functions as F

    from airflow_backfill.engine.delta.listed_files import read_table

    keys = feed.select(*(F.col(u).alias(m) for u, m in zip(upstream_key, mv_key, strict=True))).distinct().cache()
    try:
        bounds = keys.agg(F.min(mv_key[0]), F.max(mv_key[0])).first()
        if bounds is None or bounds[0] is None:
            return 0
        mv = read_table(spark, target).select(*mv_key)  # its listed files, as the engine reads them
        within = mv.filter(F.col(mv_key[0]).between(bounds[0], bounds[1]))
        if len(mv_key) > 1:
            within = within.join(F.broadcast(keys.select(mv_key[0])), on=[mv_key[0]], how="left_semi")
        return within.join(keys, on=list(mv_key), how="left_semi").count()
    finally:
        keys.unpersist()


def forward_freshness(spark: SparkSession, settings: SectionSettings) -> dict[str, Any]:
    """Commit-to-MV latency while the upstream commits an RF1 epoch every `epoch_interval`."""
    from deltalake import DeltaTable

    from airflow_backfill.engine.phases.catch_up import run_catch_up
    from airflow_backfill.engine.phases.forward import ForwardBounds, run_forward
    from airflow_backfill.engine.phases.snapshot import run_snapshot

    job = _long_lived_job(settings)
    run_snapshot(spark, job, parallelism=settings.parallelism)  # a no-op when catch-up made it
    run_catch_up(spark, job, parallelism=settings.parallelism)
    warm_up_apply(spark, settings, job, insert=True)
    writer = _EpochWriter(settings)
    stop = threading.Event()
    writer.start(stop, job.target, job.app_id)
    timer = PhaseTimer()
    with timing_apply(timer), stopwatch() as elapsed:
        forward = run_forward(spark, job, parallelism=settings.parallelism, bounds=ForwardBounds(), stop=stop)
    writer.join()
    if writer.error is not None:
        raise writer.error
    latencies = freshness_latencies(
        DeltaTable(job.source).history(), DeltaTable(job.target).history(), writer.versions
    )
    if not latencies:
        raise RuntimeError("no upstream epoch was reflected by the MV during the freshness run")
    return {
        "parallelism": settings.parallelism,
        "epochs": len(writer.versions),
        "epochs_reflected": len(latencies),
        "epoch_interval_s": settings.epoch_interval,
        "poll_interval_s": settings.poll_interval,
        "orders_per_epoch": writer.orders_per_epoch,
        "lineitems_per_epoch_mean": round(writer.lineitems / max(1, len(writer.versions)), 1),
        "upstream_commit_s_median": round(median(writer.commit_seconds), 3),
        "mv_commits": forward.commits,
        "commit_steps_mean_s": apply_breakdown(timer.take(), forward.commits),
        "median_s": round(median(latencies), 3),
        "p95_s": round(percentile(latencies, 0.95), 3),
        "max_s": round(max(latencies), 3),
        "forward_s": round(elapsed(), 3),
    }


def _long_lived_job(settings: SectionSettings) -> Any:
    return lineitem_job(
        settings.workspace, MV_NAME, os.path.join(settings.workspace.root, "mv", MV_NAME), QUERIES["stateless"],
        backfill_parallelism=settings.parallelism, parallelism=settings.parallelism, lag_threshold=0,
        poll_interval=settings.poll_interval,
    )


class _EpochWriter:
    """The live upstream: one RF1 refresh (one lineitem commit) every `epoch_interval` s.

    After the last epoch it waits until the MV's watermark reaches it, then stops forward.
    """

    DRAIN_TIMEOUT = 120.0

    def __init__(self, settings: SectionSettings) -> None:
        from airflow_backfill import tpch

        self._settings = settings
        self._tables = settings.workspace.tables
        self.orders_per_epoch = tpch.refresh_count(self._tables)
        self.versions: list[int] = []
        self.commit_seconds: list[float] = []
        self.lineitems = 0
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def start(self, stop: threading.Event, target: str, app_id: str) -> None:
        self._thread = threading.Thread(target=self._run, args=(stop, target, app_id), name="epoch-writer")
        self._thread.start()

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()

    def _run(self, stop: threading.Event, target: str, app_id: str) -> None:
        try:
            self._write_epochs(stop)
            self._wait_for_mv(stop, target, app_id)
        except BaseException as error:  # reported by the section after forward stopped
            self.error = error
        finally:
            stop.set()

    def _write_epochs(self, stop: threading.Event) -> None:
        from airflow_backfill import tpch

        started = time.monotonic()
        for epoch in range(1, self._settings.freshness_epochs + 1):
            if stop.wait(max(0.0, started + epoch * self._settings.epoch_interval - time.monotonic())):
                return
            with stopwatch() as elapsed:
                refresh = tpch.insert_new_orders(self._tables, self._settings.seed, self.orders_per_epoch)
            self.commit_seconds.append(elapsed())
            self.versions.append(refresh.lineitem_version)
            self.lineitems += refresh.lineitems

    def _wait_for_mv(self, stop: threading.Event, target: str, app_id: str) -> None:
        from airflow_backfill.engine.delta.log import read_watermark

        deadline = time.monotonic() + self.DRAIN_TIMEOUT
        last = self.versions[-1] if self.versions else 0
        while time.monotonic() < deadline and not stop.is_set():
            if (read_watermark(target, app_id) or 0) >= last:
                return
            time.sleep(0.1)


SECTIONS = {
    "snapshot_overhead": snapshot_overhead,
    "scaling": scaling,
    "catch_up": catch_up_cost,
    "refresh": refresh_catch_up,
    "freshness": forward_freshness,
}
