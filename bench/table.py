"""Build the figures of docs/benchmarks.md, the README's cost table and the run history
from the committed runs in bench/results/.

    python bench/table.py            # rewrite the generated parts of the three pages
    python bench/table.py --check    # exit 1, naming the page, when one differs from the runs

Each row of the table is one measurement with its target; its figure is that of the
latest run (by start time) of the row's benchmark at the row's scale factor that
measured it, with that run's command, commit and date. A run's JSON is written by the
benchmark command itself (`bench/run_record.py`); nothing here measures. Runs recorded
before the benchmarks wrote their JSON were transcribed from the page into the same
shape (`meta.transcribed` says from where), and the table marks their rows.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python bench/table.py` puts bench/, not the checkout, on the path
    sys.path.insert(0, str(ROOT))

from bench import report, round_size, run_record  # noqa: E402
from bench.run_record import RESULTS_DIR  # noqa: E402

BENCHMARKS_PAGE = ROOT / "docs" / "benchmarks.md"
HISTORY_PAGE = ROOT / "docs" / "benchmark-history.md"
README = ROOT / "README.md"
TRANSCRIBED_MARK = "†"
"""Marks the commit of a figure transcribed from the page before the benchmarks wrote JSON."""

Result = dict[str, Any]


@dataclass(frozen=True)
class Figure:
    """A row's figure in one run: the text the table shows and whether it meets the target
    (None for a figure that is only reported)."""

    text: str
    met: bool | None = None


@dataclass(frozen=True)
class Row:
    """One measurement: the runs that can hold it and how to read it from their JSON."""

    anchor: str
    """The row's link target (`benchmarks.md#<anchor>`): prose quotes its figure through it."""
    measurement: str
    target: str
    bench: str
    """`meta.bench` of the runs: run, joins, kafka, object_store, folder_backfill or round_size."""
    scale: float | None
    """The TPC-H scale factor the row is about (None: the benchmark has none)."""
    read: Callable[[Result], Figure | None]
    across: Callable[[Sequence[Run]], tuple[Run, Figure] | None] | None = None
    """For a figure that compares runs (two sizes): found among all runs instead of one."""


def _get(data: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


def _s(seconds: float) -> str:
    return f"{seconds:.2f} s"


def _x(ratio: float) -> str:
    return f"{ratio:.2f}x"


def _ratio_against(ratio: float | None, engine: float | None, plain: float | None, target: float | None,
                   at_most: bool) -> Figure | None:
    """"1.48x (3.76 s vs 2.54 s)", met when the ratio is within the target."""
    if ratio is None:
        return None
    detail = f" ({_s(engine)} vs {_s(plain)})" if engine is not None and plain is not None else ""
    met = None if target is None else (ratio <= target if at_most else ratio >= target)
    return Figure(_x(ratio) + detail, met)


def snapshot_overhead(kind: str, target: float | None) -> Callable[[Result], Figure | None]:
    def read(result: Result) -> Figure | None:
        case = _get(result, "snapshot_overhead", kind) or {}
        if case.get("status") != "measured":
            return None
        return _ratio_against(case.get("ratio"), case.get("engine_median_s"), case.get("plain_median_s"),
                              target, at_most=True)
    return read


def scaling(result: Result) -> Figure | None:
    figures = _get(result, "scaling") or {}
    if "speedup" not in figures:
        return None
    plain = figures.get("plain_speedup")
    detail = f"; plain Spark itself {_x(plain)}" if plain is not None else ""
    return Figure(f"{_x(figures['speedup'])} ({_s(figures['p1_median_s'])} -> {_s(figures['p2_median_s'])}{detail})",
                  figures["speedup"] >= 1.6)


def catch_up_case(*path: str, target: float) -> Callable[[Result], Figure | None]:
    """A catch-up case against the plain recompute at the same version."""
    def read(result: Result) -> Figure | None:
        case = _get(result, "catch_up", *path) or {}
        speedup = case.get("speedup")
        if speedup is None:
            return None
        return _ratio_against(speedup, case.get("catch_up_s"), case.get("plain_s"), target, at_most=False)
    return read


def one_row(result: Result) -> Figure | None:
    case = _get(result, "catch_up", "one_row") or {}
    seconds = case.get("catch_up_s")
    if seconds is None:
        return None
    plain = case.get("plain_s")
    detail = f" (plain recompute {_s(plain)})" if plain is not None else ""
    return Figure(_s(seconds) + detail, seconds <= report.ONE_ROW_TARGET_S)


def driver_memory(result: Result) -> Figure | None:
    ten = _get(result, "catch_up", "shares", "0.1", "driver_python_peak_mib")
    one = _get(result, "catch_up", "shares", "0.01", "driver_python_peak_mib")
    if not ten or not one:
        return None
    growth = ten / one
    return Figure(f"{_x(growth)} ({ten:.0f} MiB vs {one:.0f} MiB)", growth <= report.DRIVER_MEMORY_GROWTH_TARGET)


def pair(section: str, kind: str, target: float) -> Callable[[Result], Figure | None]:
    """One RF1 + RF2 pair caught up against a plain recompute (`refresh`, or `submit`:
    each side its own spark-submit)."""
    def read(result: Result) -> Figure | None:
        case = _get(result, section, kind) or {}
        return _ratio_against(case.get("speedup"), case.get("catch_up_median_s"), case.get("plain_median_s"),
                              target, at_most=False)
    return read


def freshness(result: Result) -> Figure | None:
    figures = _get(result, "freshness") or {}
    if "median_s" not in figures:
        return None
    met = (figures["median_s"] <= report.FRESHNESS_MEDIAN_TARGET and figures["p95_s"] <= report.FRESHNESS_P95_TARGET)
    return Figure(f"median {_s(figures['median_s'])}, p95 {_s(figures['p95_s'])}", met)


def orchestration(result: Result) -> Figure | None:
    figures = _get(result, "orchestration") or {}
    if "wall_s" not in figures:
        return None
    return Figure(f"{_s(figures['wall_s'])} vs {_s(figures['spark_s'])}")


MEMORY_SECTIONS = (("snapshot_overhead", "snapshot"), ("catch_up", "catch-up"), ("refresh", "refresh pairs"),
                   ("freshness", "forward"), ("orchestration", "`airflow dags test`"))


def peak_memory(result: Result) -> Figure | None:
    memory = _get(result, "memory") or {}
    parts = []
    for section, label in MEMORY_SECTIONS:
        peaks = [value["peak_rss_mib"] for key, value in memory.items()
                 if key.split(" ")[0] == section and isinstance(value, dict) and value.get("peak_rss_mib")]
        if peaks:
            parts.append(f"{label} {max(peaks) / 1024:.1f} GiB")
    return Figure(", ".join(parts)) if parts else None


def kafka(result: Result) -> Figure | None:
    overhead = result.get("overhead")
    if overhead is None:
        return None
    return _ratio_against(overhead, result.get("source_backfill_seconds"), result.get("plain_read_mean_s"), 1.15,
                          at_most=True)


def folder_backfill(result: Result) -> Figure | None:
    folder, per_mv = result.get("folder_seconds"), result.get("per_mv_seconds")
    if folder is None or per_mv is None:
        return None
    exact = _get(result, "exact_folder", "exact")
    projected = f", projected from {result.get('per_mv_measured')} MVs" if result.get("per_mv_projected") else ""
    speedup = result.get("speedup") or per_mv / folder
    return Figure(f"{_s(folder)} vs {_s(per_mv)} per MV{projected}, {_x(speedup)} ({exact} of "
                  f"{result.get('mvs')} MVs exact at every commit)", folder <= 180 and exact == result.get("mvs"))


def object_store(result: Result) -> Figure | None:
    snapshot, catch_up = _get(result, "snapshot", "s3_over_local"), _get(result, "catch_up", "s3_over_local")
    if snapshot is None or catch_up is None:
        return None
    return Figure(f"{_x(snapshot)} / {_x(catch_up)}")


def join_snapshot(kind: str) -> Callable[[Result], Figure | None]:
    def read(result: Result) -> Figure | None:
        case = _get(result, kind, "snapshot") or {}
        return _ratio_against(case.get("ratio"), case.get("engine_median_s"), case.get("plain_median_s"), 1.5,
                              at_most=True)
    return read


def join_refresh(kind: str, target: float) -> Callable[[Result], Figure | None]:
    """A join's RF1 + RF2 round against recomputing the MV (the engine's snapshot), and
    against the plain Spark job of its query."""
    def read(result: Result) -> Figure | None:
        case = _get(result, kind, "refresh") or {}
        speedup = case.get("speedup")
        if speedup is None:
            return None
        parts = []
        if case.get("catch_up_median_s") is not None and case.get("recompute_median_s") is not None:
            parts.append(f"{_s(case['catch_up_median_s'])} vs {_s(case['recompute_median_s'])}")
        if case.get("speedup_vs_plain") is not None:
            plain = case.get("plain_median_s")
            parts.append(f"{_x(case['speedup_vs_plain'])} a plain Spark job" + (f", {_s(plain)}" if plain else ""))
        detail = f" ({'; '.join(parts)})" if parts else ""
        return Figure(_x(speedup) + detail, speedup >= target)
    return read


MANY_MVS_SIZES = (20_000, 200_000, 2_000_000)
"""Rows an upstream of the many_mvs section's users' runs, each a row group of the table."""
KIND_LABELS = {"stateless": "stateless", "aggregate": "aggregate", "over_mv": "over an MV", "join": "join"}


def _size(rows: int) -> str:
    return f"{rows // 1_000_000} M" if rows >= 1_000_000 else f"{rows // 1_000} k"


def many_mvs_users(result: Result, rows: int) -> dict[str, Any] | None:
    """The many_mvs section of a run with the users' writers at `rows` rows an upstream."""
    section = _get(result, "many_mvs") or {}
    if section.get("status") != "measured" or section.get("writers") != "users" or section.get("rows") != rows:
        return None
    return section


def many_mvs_freshness(rows: int) -> Callable[[Result], Figure | None]:
    def read(result: Result) -> Figure | None:
        section = many_mvs_users(result, rows) or {}
        fresh = _get(section, "steady", "freshness") or {}
        if "median_s" not in fresh:
            return None
        kinds = ", ".join(f"{KIND_LABELS.get(kind, kind)} {_s(found['median_s'])} / {_s(found['p95_s'])}"
                          for kind, found in fresh.get("kinds", {}).items())
        exited = section.get("forward_exit") or {}
        crash = f"; the forward exited after {exited['after_s']:.0f} s" if exited.get("exited_by_itself") else ""
        missed = fresh.get("not_reflected_counted_as_lower_bound")
        bounds = f"; {missed} of {fresh['samples']} not reflected by the end: lower bounds" if missed else ""
        rate = _get(section, "writers_in_window", "commits_per_s")
        writers = f"; writers {rate} commits/s" if rate is not None else ""
        options = section.get("forward_java_options")
        diagnostic = f"; driver also run with `{options}`" if options else ""
        met = fresh["median_s"] <= report.MANY_MVS_MEDIAN_TARGET and fresh["p95_s"] <= report.MANY_MVS_P95_TARGET
        return Figure(f"median {_s(fresh['median_s'])}, p95 {_s(fresh['p95_s'])}, max {_s(fresh['max_s'])} "
                      f"({kinds}{bounds}{writers}{crash}{diagnostic})", met)
    return read


def many_mvs_rounds(rows: int) -> Callable[[Result], Figure | None]:
    def read(result: Result) -> Figure | None:
        section = many_mvs_users(result, rows) or {}
        whole = section.get("whole_run") or section  # runs before the whole run was kept: their window's
        logged = whole.get("logged_rounds") or {}
        if not logged or "status" in logged:
            return None
        kinds = ", ".join(f"{KIND_LABELS.get(kind, kind)} {_s(found['median_s'])} / {_s(found['p90_s'])} "
                          f"({found['count']})" for kind, found in logged.items())
        checks = _get(whole, "key_checks", "all", "upstream_read") or {}
        check = (f"; key checks reading the upstream: {checks['count']}, median {_s(checks['median_s'])}"
                 if checks.get("count") else "; no key check read the upstream")
        writes = whole.get("writes") or {}
        rewrites = (f"; {writes['whole_mv_rewrites']} of {writes['rounds']} rounds rewrote a whole MV"
                    if "rounds" in writes else "")
        cache = section.get("code_cache") or {}
        full = (f"; JVM code cache full at {cache['at_jvm_uptime_s']:.0f} s" if cache.get("at_jvm_uptime_s")
                else "; JVM code cache full" if cache.get("full") else "; code cache never full")
        scope = "the forward's whole run" if "whole_run" in section else "the window"
        return Figure(f"{kinds} (median / p90 (rounds), {scope}){check}{rewrites}{full}")
    return read


def many_mvs_memory(rows: int) -> Callable[[Result], Figure | None]:
    def read(result: Result) -> Figure | None:
        section = many_mvs_users(result, rows) or {}
        total = section.get("platform_steady_pss_peak_gib")
        if total is None:
            return None
        forward = _get(section, "steady", "pss_peak_mib") or 0.0
        airflow = _get(section, "airflow", "pss_peak_mib") or 0.0
        cpu = _get(section, "steady", "cpu_cores")
        return Figure(f"{total:.2f} GiB PSS (forward {forward / 1024:.2f} GiB, Airflow and PostgreSQL "
                      f"{airflow / 1024:.2f} GiB); forward CPU {cpu} cores", total <= report.MANY_MVS_RSS_TARGET_GIB)
    return read


def many_mvs_exact(rows: int) -> Callable[[Result], Figure | None]:
    def read(result: Result) -> Figure | None:
        section = many_mvs_users(result, rows) or {}
        last = _get(section, "exact", "last_watermark") or {}
        if "checked" not in last:
            return None
        every = _get(section, "exact", "every_version") or {}
        versions = (f"; {every['exact']} of {every['checked']} versions in the window ({len(every['mvs'])} MVs)"
                    if every.get("checked") else "")
        met = last["exact"] == last["checked"] and every.get("exact", 0) == every.get("checked", 0)
        return Figure(f"{last['exact']} of {last['checked']} at the last watermark{versions}", met)
    return read


def many_mvs_size_ratio(runs: Sequence[Run]) -> tuple[Run, Figure] | None:
    """Freshness at 2 M rows an upstream over that at 20 k (each size's latest run). Met
    only when the writers kept a like load at both sizes: fewer commits a second at 2 M
    (delta-rs rewrites every file an update touches) make fewer, smaller rounds."""
    large_row, small_row = (ROWS_BY_ANCHOR[f"many-mvs-{label}-freshness"] for label in ("2m", "20k"))
    large, small = latest(large_row, runs), latest(small_row, runs)
    if large is None or small is None:
        return None
    figures = [_get(run.result, "many_mvs", "steady", "freshness") for run, _ in (large, small)]
    rates = [_get(run.result, "many_mvs", "writers_in_window", "commits_per_s") or 0.0 for run, _ in (large, small)]
    ratios = [figures[0][name] / figures[1][name] if figures[1][name] else float("inf") for name in ("median_s", "p95_s")]
    like_load = rates[0] >= LIKE_WRITE_LOAD * rates[1]
    caveat = "" if like_load else "; not like for like: the writers' rate at 2 M was below 3/4 of that at 20 k"
    return large[0], Figure(f"median {_x(ratios[0])}, p95 {_x(ratios[1])} (2 M: {_s(figures[0]['median_s'])} / "
                            f"{_s(figures[0]['p95_s'])} at {rates[0]} commits/s; 20 k: {_s(figures[1]['median_s'])} / "
                            f"{_s(figures[1]['p95_s'])} at {rates[1]} commits/s{caveat})",
                            max(ratios) <= 1.5 and like_load)


LIKE_WRITE_LOAD = 0.75
"""The share of the small run's commit rate the large run's writers must keep for the two
sizes' freshness to be compared."""


def round_500(result: Result) -> Figure | None:
    """The warm round of 500 changed rows on the 2 M-row MV, and its ratio to the 20 k one."""
    sizes = _get(result, "round_size", "sizes") or {}
    large, small = sizes.get("2m"), sizes.get("20k")
    if large is None or small is None:
        return None
    ratio = large["round_median_s"] / small["round_median_s"]
    return Figure(f"{_s(large['round_median_s'])}, {_x(ratio)} of 20 k ({_s(small['round_median_s'])}); "
                  f"plain recompute {_s(large['plain_median_s'])} / {_s(small['plain_median_s'])}; "
                  f"at most {large['rows_written_max']} rows written",
                  large["round_median_s"] <= round_size.ROUND_TARGET_S and ratio <= round_size.SIZE_RATIO_TARGET
                  and not large["differences"] and not small["differences"])


def many_mvs_rows() -> tuple[Row, ...]:
    rows: list[Row] = []
    for size in MANY_MVS_SIZES:
        label, name = run_record.rows_label(size), _size(size)
        prefix = f"fifty MVs, users' writers, {name} rows an upstream"
        rows += [
            Row(f"many-mvs-{label}-freshness", f"{prefix}: freshness, every MV against its base upstream(s)",
                "median <= 3 s, p95 <= 10 s", "run", None, many_mvs_freshness(size)),
            Row(f"many-mvs-{label}-rounds", f"{prefix}: round seconds by kind, key checks that read the upstream, "
                "whole-MV rewrites, code cache",
                "(reported)", "run", None, many_mvs_rounds(size)),
            Row(f"many-mvs-{label}-memory", f"{prefix}: every process of the platform, resident (PSS)",
                "<= 12 GiB", "run", None, many_mvs_memory(size)),
            Row(f"many-mvs-{label}-exact", f"{prefix}: exact (the tests' oracle)", "all", "run", None,
                many_mvs_exact(size)),
        ]
    rows.append(Row("many-mvs-2m-vs-20k", "fifty MVs, users' writers: freshness at 2 M rows an upstream / at 20 k",
                    "<= 1.5x", "run", None, lambda result: None, across=many_mvs_size_ratio))
    return tuple(rows)


ROWS: tuple[Row, ...] = (
    Row("snapshot-stateless", "snapshot / plain Spark job, stateless MV, key proved", "<= 1.3x", "run", 1.0,
        snapshot_overhead("stateless", report.SNAPSHOT_OVERHEAD_TARGET)),
    Row("snapshot-unverified", "snapshot / plain, stateless MV, `verify_primary_key: false`", "(reported)", "run",
        1.0, snapshot_overhead("stateless_unverified_key", None)),
    Row("snapshot-q1", "snapshot / plain, Q1 aggregate MV", "(reported)", "run", 1.0,
        snapshot_overhead("aggregate", None)),
    Row("snapshot-scaling", "snapshot scaling, backfill parallelism 1 -> 2", ">= 1.6x", "run", 1.0, scaling),
    Row("round-q1", "Q1 aggregate: one RF1 + RF2 round / plain recompute", ">= 3x", "run", 1.0,
        pair("refresh", "aggregate", 3.0)),
    Row("round-stateless", "stateless MV: one RF1 + RF2 round / plain recompute", ">= 1.5x", "run", 1.0,
        pair("refresh", "stateless", 1.5)),
    Row("round-one-row", "a round of one updated row", "<= 0.5 s", "run", 1.0, one_row),
    Row("round-updates-tenth-pct", "0.1 % of the rows updated, scattered: catch-up / plain recompute", ">= 1.0x", "run",
        1.0, catch_up_case("shares", "0.001", target=1.0)),
    Row("round-updates-1-pct", "1 % of the rows updated, scattered", ">= 1.0x", "run", 1.0,
        catch_up_case("shares", "0.01", target=1.0)),
    Row("round-updates-10-pct", "10 % of the rows updated, scattered", ">= 1.0x", "run", 1.0,
        catch_up_case("shares", "0.1", target=1.0)),
    Row("round-updates-newest", "1 % of the rows updated, the newest orders' (clustered by key)", ">= 1.0x", "run",
        1.0, catch_up_case("newest", target=1.0)),
    Row("round-driver-memory", "driver Python peak, catch-up of 10 % / of 1 % of the rows", "<= 1.25x", "run", 1.0,
        driver_memory),
    Row("round-q1-sf10", "SF 10: Q1 aggregate, one RF1 + RF2 round / plain recompute", ">= 15x", "run", 10.0,
        pair("refresh", "aggregate", 15.0)),
    Row("round-stateless-sf10", "SF 10: stateless MV, one RF1 + RF2 round / plain recompute", ">= 4x", "run", 10.0,
        pair("refresh", "stateless", 4.0)),
    Row("submit-q1", "as a DAG runs it (each side its own `spark-submit`): Q1 catch-up / plain recompute",
        ">= 1.5x", "run", 1.0, pair("submit", "aggregate", report.SUBMIT_TARGETS["aggregate"])),
    Row("submit-stateless", "as a DAG runs it: stateless catch-up / plain recompute", ">= 1.2x", "run", 1.0,
        pair("submit", "stateless", report.SUBMIT_TARGETS["stateless"])),
    Row("freshness", "forward freshness: upstream commit to MV commit, an epoch a second",
        "median <= 1.5 s, p95 <= 3 s", "run", 1.0, freshness),
    Row("orchestration", "`airflow dags test` / the phases' Spark time", "(reported)", "run", 1.0, orchestration),
    Row("memory", "peak memory (the process tree's resident set) per section", "(reported)", "run", 1.0,
        peak_memory),
    Row("join-snapshot-rows", "joins, TPC-H Q3: snapshot / plain Spark job, stateless `q3_rows`", "<= 1.5x",
        "joins", 1.0, join_snapshot("q3_rows")),
    Row("join-snapshot-q3", "joins: snapshot / plain Spark job, aggregate `q3`", "<= 1.5x", "joins", 1.0,
        join_snapshot("q3")),
    Row("join-round-rows", "joins: `q3_rows`, one RF1 + RF2 round / recompute (the engine's snapshot)", ">= 3x",
        "joins", 1.0, join_refresh("q3_rows", 3.0)),
    Row("join-round-q3", "joins: `q3`, one RF1 + RF2 round / recompute", ">= 3x", "joins", 1.0,
        join_refresh("q3", 3.0)),
    Row("join-snapshot-rows-sf10", "SF 10 joins: snapshot / plain Spark job, `q3_rows`", "<= 1.5x", "joins", 10.0,
        join_snapshot("q3_rows")),
    Row("join-snapshot-q3-sf10", "SF 10 joins: snapshot / plain Spark job, `q3`", "<= 1.5x", "joins", 10.0,
        join_snapshot("q3")),
    Row("join-round-rows-sf10", "SF 10 joins: `q3_rows`, one RF1 + RF2 round / recompute", ">= 10x", "joins", 10.0,
        join_refresh("q3_rows", 10.0)),
    Row("join-round-q3-sf10", "SF 10 joins: `q3`, one RF1 + RF2 round / recompute", ">= 10x", "joins", 10.0,
        join_refresh("q3", 10.0)),
    Row("kafka", "Kafka topic backfill / a plain Spark read of the topic, 5 M records", "<= 1.15x", "kafka", None,
        kafka),
    Row("object-store", "tables on the loopback S3 server / local files: snapshot / catch-up", "(reported)",
        "object_store", None, object_store),
    Row("folder-backfill", "fifty MVs (the users' mix, four upstreams of 150 k rows) backfilled from nothing: "
        "the folder as one application vs a spark-submit per MV's phase", "<= 3 min", "folder_backfill", None,
        folder_backfill),
    Row("round-500-2m", "a forward round of 500 changed rows (delta-rs: 50 deleted, 400 updated, 50 re-inserted) "
        "on a 2 M-row stateless MV, warm; and its ratio to the same round on a 20 k-row MV", "<= 0.5 s, <= 1.5x", "round_size",
        None, round_500),
    *many_mvs_rows(),
)
ROWS_BY_ANCHOR = {row.anchor: row for row in ROWS}

COST_ROWS = ("round-q1", "round-stateless", "round-one-row", "round-q1-sf10", "round-stateless-sf10",
             "join-round-rows", "join-round-q3", "submit-q1", "freshness")
"""The rows the README's "What it costs to run" shows."""


@dataclass(frozen=True)
class Run:
    path: Path
    result: Result

    @property
    def meta(self) -> dict[str, Any]:
        return self.result.get("meta") or {}

    @property
    def transcribed(self) -> bool:
        return bool(self.meta.get("transcribed"))

    @property
    def commit_cell(self) -> str:
        commit = str(self.meta.get("commit", "?"))
        if self.transcribed:
            return commit + TRANSCRIBED_MARK
        if str(self.meta.get("commit_note", "")).startswith("inferred"):
            return commit + " (inferred)"
        return commit + (" (with uncommitted changes)" if self.meta.get("dirty") else "")


def load_runs(directory: Path = RESULTS_DIR) -> list[Run]:
    """Every run in `directory`, oldest first (by start time, then file name)."""
    runs = [Run(path, json.loads(path.read_text())) for path in sorted(directory.glob("*.json"))]
    return sorted(runs, key=lambda run: (str(run.meta.get("started", "")), run.path.name))


def _same_scale(run: Run, scale: float | None) -> bool:
    if scale is None:
        return True
    value = run.meta.get("scale_factor")
    return value is not None and float(value) == scale


def latest(row: Row, runs: Sequence[Run]) -> tuple[Run, Figure] | None:
    """The latest full run (not `--quick`) of the row's benchmark and scale that measured it."""
    if row.across is not None:
        return row.across(runs)
    for run in reversed(runs):
        if run.meta.get("bench") != row.bench or run.meta.get("quick") or not _same_scale(run, row.scale):
            continue
        figure = row.read(run.result)
        if figure is not None:
            return run, figure
    return None


def _met(figure: Figure) -> str:
    return {True: "yes", False: "no", None: ""}[figure.met]


def figures_table(runs: Sequence[Run]) -> str:
    lines = ["| measurement | target | latest figure | met | command | commit | date |",
             "|---|---|---|---|---|---|---|"]
    for row in ROWS:
        found = latest(row, runs)
        cells = [f'<a id="{row.anchor}"></a>{row.measurement}', row.target]
        if found is None:
            cells += ["not measured yet", "", "", "", ""]
        else:
            run, figure = found
            cells += [figure.text, _met(figure), f"`{run.meta.get('command', '?')}`", run.commit_cell,
                      str(run.meta.get("date", "?"))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cost_table(runs: Sequence[Run]) -> str:
    """The README's small table: what a round and forward take, linked to their rows."""
    lines = ["| what | figure | target |", "|---|---|---|"]
    for anchor in COST_ROWS:
        row = ROWS_BY_ANCHOR[anchor]
        found = latest(row, runs)
        figure = "not measured yet" if found is None else found[1].text
        lines.append(f"| [{row.measurement}](docs/benchmarks.md#{anchor}) | {figure} | {row.target} |")
    return "\n".join(lines)


def _history_line(run: Run) -> str:
    meta = run.meta
    rows = [row for row in ROWS if row.bench == meta.get("bench")]
    scaled = [row for row in rows if row.scale is not None]
    if scaled and not any(_same_scale(run, row.scale) for row in scaled):  # another scale (a quick run): its SF 1 rows' figures
        rows = [row for row in rows if row.scale in (None, 1.0)]
    else:
        rows = [row for row in rows if _same_scale(run, row.scale)]
    figures = [f"{row.anchor} {figure.text.split(' (')[0]}" for row in rows
               if (figure := row.read(run.result)) is not None]
    load = f"load {meta.get('load_before', '-')} / {meta.get('load_after', '-')}"
    seconds = f", {meta['seconds']:.0f} s" if isinstance(meta.get("seconds"), int | float) else ""
    source = f" (transcribed: {meta['transcribed']})" if run.transcribed else ""
    quick = " (`--quick`: not in the table)" if meta.get("quick") else ""
    return (f"| {meta.get('date', '?')} | {run.commit_cell} | `{meta.get('command', '?')}`{quick} | "
            f"{load}{seconds} | {'; '.join(figures) or '-'}{source} | `{run.path.name}` |")


def history_table(runs: Sequence[Run]) -> str:
    lines = ["| date | commit | command | load before / after, time | figures | file |", "|---|---|---|---|---|---|"]
    lines += [_history_line(run) for run in reversed(runs)]
    return "\n".join(lines)


def marker(name: str, end: bool = False) -> str:
    return f"<!-- bench-table: {name} {'end' if end else 'start'} -->"


def replaced(text: str, name: str, body: str, page: Path) -> str:
    """`text` with the part between the `name` markers replaced by `body`."""
    start, end = marker(name), marker(name, end=True)
    if text.count(start) != 1 or text.count(end) != 1:
        raise ValueError(f"{page} must hold the markers {start!r} and {end!r} once each")
    head, rest = text.split(start)
    _, tail = rest.split(end)
    return f"{head}{start}\n{body}\n{end}{tail}"


def generated(runs: Sequence[Run]) -> dict[Path, list[tuple[str, str]]]:
    """Per page, the generated parts: (marker name, content)."""
    return {
        BENCHMARKS_PAGE: [("figures", figures_table(runs))],
        README: [("cost", cost_table(runs))],
        HISTORY_PAGE: [("runs", history_table(runs))],
    }


def pages_with(runs: Sequence[Run], pages: Iterable[Path] | None = None) -> dict[Path, tuple[str, str]]:
    """Per page: its text now and its text with the generated parts from `runs`."""
    out = {}
    for page, parts in generated(runs).items():
        if pages is not None and page not in pages:
            continue
        text = page.read_text()
        new = text
        for name, body in parts:
            new = replaced(new, name, body, page)
        out[page] = (text, new)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/table.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS_DIR, help="folder of run JSON files")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a page differs")
    args = parser.parse_args(argv)
    runs = load_runs(args.results)
    stale = []
    try:
        pages = pages_with(runs)
    except ValueError as error:
        print(f"python bench/table.py: error: {error}", file=sys.stderr)
        return 2
    for page, (text, new) in pages.items():
        if text == new:
            continue
        if args.check:
            stale.append(str(page.relative_to(ROOT)))
        else:
            page.write_text(new)
            print(f"updated {page.relative_to(ROOT)}")
    if stale:
        print(f"out of date with {args.results}: {', '.join(stale)}; run `python bench/table.py`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
