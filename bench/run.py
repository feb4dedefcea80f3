"""The TPC-H lineitem benchmark of airflow_backfill, in one command.

    python bench/run.py [--scale 1] [--sections ...] [--quick] [--output FILE]

Loads TPC-H `orders`/`lineitem` at the scale factor into a scratch folder (tpchgen-cli,
nothing downloaded), then measures, each configuration in its own process:

1. snapshot overhead: engine snapshot vs a plain Spark job over the same files;
2. scaling: the snapshot at backfill parallelism 1 and 2;
3. catch-up cost: 10%, 1% and 0.1% updated rows, 1% of the newest orders' rows and one
   row, and RF1 + RF2 refresh pairs on the Q1 aggregate and the stateless MV, each
   against a plain Spark recompute of the MV at the same version (and the engine's own
   snapshot), beside the floor of any round over the same epochs (reading its change
   feed, locating its keys in the MV, its commits);
4. forward freshness: upstream commit to MV commit, one upstream epoch a second;
5. orchestration overhead: `airflow dags test` against the phases' Spark time;
6. peak memory of every case;
7. (`submit`) catch-up and a plain recompute each as its own spark-submit, as a DAG runs them;
8. (`many_mvs`) fifty MVs over live upstreams (users' writers by default) kept fresh by the
   shared forward: freshness, rounds, memory, CPU, exactness, then the same while a new MV
   backfills lineitem (bench/many_mvs.py).

Prints a table and writes the run's JSON into bench/results/, named by date and commit
(`bench/run_record.py`); `python bench/table.py` then puts its figures into
docs/benchmarks.md, which says what each one means.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # `python bench/run.py` puts bench/, not the checkout, on the path
    sys.path.insert(0, ROOT)

from airflow_backfill.shared_forward import DEFAULT_WORKERS  # noqa: E402
from bench import report, run_record  # noqa: E402
from bench.measure import stopwatch  # noqa: E402
from bench.mv_workloads import UPSTREAM_ROWS, USERS, WRITERS  # noqa: E402
from bench.workload import WARM_UP_SCALE_FACTOR  # noqa: E402

SECTIONS = ("snapshot_overhead", "scaling", "catch_up", "refresh", "freshness", "orchestration", "submit",
            "many_mvs")
DEFAULT_SECTIONS = SECTIONS[:-1]
"""`many_mvs` (about 20 minutes) runs only when named."""
PARENT_SECTIONS = ("orchestration", "submit", "many_mvs")
"""Sections that start their own processes (Airflow, spark-submit) from this one."""
CHILD_TIMEOUT_S = 30 * 60


@dataclass(frozen=True)
class ChildRun:
    """One process: a parallelism (its `local[N]` master) and the sections it runs."""

    parallelism: int
    sections: tuple[str, ...]
    results: dict[str, Any] = field(default_factory=dict, compare=False)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python bench/run.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="TPC-H scale factor (default 1)")
    parser.add_argument("--output", default=None,
                        help="JSON result file (default: bench/results/<date>-<time>-<commit>-run.json)")
    parser.add_argument("--quick", action="store_true",
                        help="fewer freshness epochs, two shares of updated rows and the one-row round in the "
                             "catch-up section, the stateless MV alone in the submit section, sections grouped in "
                             "one process per parallelism")
    parser.add_argument("--mvs", type=int, default=50, help="MVs of the many_mvs section (default 50)")
    parser.add_argument("--many-mvs-window", type=float, default=120.0,
                        help="seconds of each measured window of the many_mvs section")
    parser.add_argument("--many-mvs-workers", type=int, default=DEFAULT_WORKERS,
                        help=f"rounds the shared forward applies at once in the many_mvs section (default {DEFAULT_WORKERS})")
    parser.add_argument("--many-mvs-warm-up", type=float, default=45.0,
                        help="seconds the shared forward runs before the many_mvs section's window")
    parser.add_argument("--writers", choices=WRITERS, default=USERS,
                        help="many_mvs: the users' writers and MVs (delta-rs and Spark; default) or the simulator's")
    parser.add_argument("--upstream-rows", type=int, default=UPSTREAM_ROWS,
                        help=f"many_mvs: rows of each upstream (default {UPSTREAM_ROWS})")
    parser.add_argument("--commits-per-second", type=float, default=2.0,
                        help="many_mvs, users' writers: commits a second over all four upstreams (default 2)")
    parser.add_argument("--forward-java-options", default="",
                        help="many_mvs: JVM options added to the shared forward driver's documented ones "
                             "(a diagnostic run; default none)")
    parser.add_argument("--exact-every-version-rows", type=int, default=20_000,
                        help="many_mvs: check every MV version of the window (a sample of each kind) up to this "
                             "many rows an upstream (default 20000)")
    parser.add_argument("--sections", default=",".join(DEFAULT_SECTIONS), help=f"comma-separated subset of {SECTIONS}")
    parser.add_argument("--repeats", type=int, default=3, help="runs per snapshot measurement (median)")
    parser.add_argument("--epochs", type=int, default=None, help="freshness epochs (default 60, --quick 6)")
    parser.add_argument("--epoch-interval", type=float, default=1.0, help="seconds between upstream epochs")
    parser.add_argument("--poll-interval", type=float, default=1.0, help="forward's poll interval (job default)")
    parser.add_argument("--backfill-parallelism", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--work-dir", default=None, help="scratch folder (default: a new temporary one)")
    parser.add_argument("--keep-work", action="store_true", help="keep the scratch folder and children's logs")
    parser.add_argument("--event-log", action="store_true", help="write Spark event logs to <work>/event-log")
    args = parser.parse_args(argv)
    args.sections = tuple(s for s in args.sections.split(",") if s)
    unknown = sorted(set(args.sections) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown section(s) {unknown}; choose from {SECTIONS}")
    if args.repeats < 1:
        parser.error("--repeats must be 1 or more")
    if args.upstream_rows < 1 or args.commits_per_second <= 0:
        parser.error("--upstream-rows must be 1 or more and --commits-per-second above 0")
    if args.epochs is None:
        args.epochs = 6 if args.quick else 60
    return args


def plan_children(sections: tuple[str, ...], quick: bool, backfill_parallelism: int) -> list[ChildRun]:
    """The processes to run, in order.

    Scaling at the backfill parallelism reuses the overhead section's engine runs when
    that section runs (the same snapshot, at the same parallelism, in a session of that
    parallelism), so only parallelism 1 needs its own process. Full runs give every
    section its own process, so each peak memory is its own; quick runs group sections
    by parallelism to pay the JVM start only twice.
    """
    spark_sections = [s for s in sections if s not in PARENT_SECTIONS]
    scaling_parallelisms = [1] if "snapshot_overhead" in spark_sections else [1, backfill_parallelism]
    if quick:
        backfill = tuple(s for s in spark_sections if s in ("snapshot_overhead", "catch_up", "refresh"))
        if "scaling" in spark_sections and backfill_parallelism in scaling_parallelisms:
            backfill = ("scaling", *backfill)
        steady = tuple(s for s in spark_sections if s in ("scaling", "freshness"))
        children = [ChildRun(backfill_parallelism, backfill), ChildRun(1, steady)]
        return [child for child in children if child.sections]
    children = []
    for section in spark_sections:
        if section == "scaling":
            children += [ChildRun(parallelism, ("scaling",)) for parallelism in scaling_parallelisms]
        elif section == "freshness":
            children.append(ChildRun(1, (section,)))
        else:
            children.append(ChildRun(backfill_parallelism, (section,)))
    return children


def run_child(child: ChildRun, args: argparse.Namespace, work_dir: str, index: int) -> dict[str, Any]:
    """Run one child process; its sections' results, or a failure status for each."""
    name = f"child-{index}-p{child.parallelism}"
    config_path = os.path.join(work_dir, f"{name}.config.json")
    result_path = os.path.join(work_dir, f"{name}.result.json")
    log_path = os.path.join(work_dir, f"{name}.log")
    config = {
        "work_dir": work_dir, "parallelism": child.parallelism, "sections": list(child.sections),
        "repeats": args.repeats, "seed": args.seed, "freshness_epochs": args.epochs,
        "epoch_interval": args.epoch_interval, "poll_interval": args.poll_interval, "quick": args.quick,
    }
    with open(config_path, "w") as handle:
        json.dump(config, handle)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    if args.event_log:
        event_dir = os.path.join(work_dir, "event-log")
        os.makedirs(event_dir, exist_ok=True)
        env["PYSPARK_SUBMIT_ARGS"] = (
            f"--conf spark.eventLog.enabled=true --conf spark.eventLog.dir=file://{event_dir} pyspark-shell"
        )
    print(f"[bench] p{child.parallelism}: {', '.join(child.sections)} (log {log_path})", flush=True)
    with open(log_path, "w") as log_file:
        completed = subprocess.run(
            [sys.executable, "-m", "bench.child", config_path, result_path], cwd=ROOT, env=env,
            stdout=log_file, stderr=subprocess.STDOUT, timeout=CHILD_TIMEOUT_S, check=False,
        )
    if completed.returncode != 0 or not os.path.exists(result_path):
        failure = {"status": f"failed: child exited {completed.returncode}, see {log_path}"}
        return {section: dict(failure) for section in child.sections}
    with open(result_path) as handle:
        return json.load(handle)


def combine(children: list[ChildRun]) -> dict[str, Any]:
    """One result per section; scaling and memory gather the figures of several children."""
    result: dict[str, Any] = {"memory": {}}
    scaling: dict[str, Any] = {}
    for child in children:
        for section, figures in child.results.items():
            if section.startswith("_"):
                continue
            memory = figures.pop("memory", None)
            if memory is not None:
                result["memory"][f"{section} p{child.parallelism}"] = memory
            if section == "scaling":
                scaling[f"p{child.parallelism}"] = figures
            else:
                result[section] = figures
    overhead = result.get("snapshot_overhead", {}).get("stateless", {})
    backfill_parallelism = result.get("snapshot_overhead", {}).get("parallelism")
    if scaling and f"p{backfill_parallelism}" not in scaling and overhead.get("status") == "measured":
        scaling[f"p{backfill_parallelism}"] = {
            "parallelism": backfill_parallelism, "snapshot_s": overhead["engine_s"],
            "snapshot_median_s": overhead["engine_median_s"], "plain_median_s": overhead.get("plain_median_s"),
            "steps_median_s": overhead.get("engine_steps_median_s"), "reused": "snapshot_overhead runs",
        }
    if scaling:
        result["scaling"] = _speedup(scaling)
    return result


def _speedup(scaling: dict[str, Any]) -> dict[str, Any]:
    """p1 over the highest parallelism measured, when both were measured."""
    measured = {key: value for key, value in scaling.items() if "snapshot_median_s" in value}
    if "p1" not in measured or len(measured) < 2:
        return {**scaling, "status": "failed: needs parallelism 1 and another one measured"}
    top = max(measured, key=lambda key: int(key[1:]))
    plain = (measured["p1"].get("plain_median_s"), measured[top].get("plain_median_s"))
    return {
        **scaling,
        "p1_median_s": measured["p1"]["snapshot_median_s"],
        "p2_median_s": measured[top]["snapshot_median_s"],
        "speedup": round(measured["p1"]["snapshot_median_s"] / measured[top]["snapshot_median_s"], 3),
        "plain_speedup": round(plain[0] / plain[1], 3) if all(plain) else None,
    }


def _submit_section(work_dir: str, tables: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Catch-up and the plain recompute each as its own spark-submit (bench/submit.py)."""
    from bench.submit import submitted_catch_up

    print("[bench] submit: catch-up and plain recompute, each its own spark-submit", flush=True)
    with stopwatch() as elapsed:
        try:
            section = submitted_catch_up(work_dir, tables, args)
        except Exception as error:  # reported like a failed child section
            section = {"status": f"failed: {type(error).__name__}: {str(error)[-500:]}"}
    section["section_s"] = round(elapsed(), 3)
    return section


def _many_mvs_section(work_dir: str, tables: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Many MVs kept fresh by one shared forward (bench/many_mvs.py)."""
    from bench.many_mvs import many_mvs_section

    print(f"[bench] many_mvs: the {args.writers}' MVs over upstreams of {args.upstream_rows} rows, one shared forward",
          flush=True)
    with stopwatch() as elapsed:
        try:
            section = many_mvs_section(work_dir, tables, args)
        except Exception as error:  # reported like a failed child section
            section = {"status": f"failed: {type(error).__name__}: {str(error)[-500:]}"}
    section["section_s"] = round(elapsed(), 3)
    return section


def many_mvs_label(args: argparse.Namespace) -> str | None:
    """`many_mvs-users-20k`: what a run of the many_mvs section is named by (its writers and
    size); None for runs without it."""
    if "many_mvs" not in args.sections:
        return None
    return f"many_mvs-{args.writers}-{run_record.rows_label(args.upstream_rows)}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    from airflow_backfill import tpch

    work_dir = os.path.abspath(args.work_dir or tempfile.mkdtemp(prefix="airflow_backfill-bench-"))
    os.makedirs(work_dir, exist_ok=True)
    meta: dict[str, Any] = {
        **run_record.run_meta("run", "run.py", argv, label=many_mvs_label(args)),
        "scale_factor": args.scale, "quick": args.quick, "sections": list(args.sections),
        "repeats": args.repeats, "backfill_parallelism": args.backfill_parallelism, "seed": args.seed,
        "work_dir": work_dir,
    }
    print(f"[bench] scale factor {args.scale}, load {meta['load_before']}, work dir {work_dir}", flush=True)
    failed = False
    with stopwatch() as elapsed:
        with stopwatch() as load_elapsed:
            tables = tpch.load_tpch(os.path.join(work_dir, "tpch"), args.scale)
            tpch.load_tpch(os.path.join(work_dir, "tpch-warm-up"), min(args.scale, WARM_UP_SCALE_FACTOR))
        meta["tpch_load_s"] = round(load_elapsed(), 3)
        print(f"[bench] loaded TPC-H into {tables.root} in {meta['tpch_load_s']} s", flush=True)
        children = plan_children(args.sections, args.quick, args.backfill_parallelism)
        for index, child in enumerate(children):
            child.results.update(run_child(child, args, work_dir, index))
        result = combine(children)
        if "orchestration" in args.sections:
            from bench.orchestration import orchestration_overhead

            print("[bench] orchestration: airflow dags test", flush=True)
            orchestration = orchestration_overhead(work_dir, tables, args)
            memory = orchestration.pop("memory", None)
            if memory is not None:
                result["memory"]["orchestration"] = memory
            result["orchestration"] = orchestration
        if "submit" in args.sections:
            result["submit"] = _submit_section(work_dir, tables, args)
        if "many_mvs" in args.sections:
            result["many_mvs"] = _many_mvs_section(work_dir, tables, args)
    result = {"meta": run_record.finish_meta(meta, elapsed()), **result}
    failed = any(str(section.get("status", "")).startswith("failed") for section in result.values()
                 if isinstance(section, dict))
    output = run_record.write_result(result, args.output)
    print(report.render(result))
    print(f"[bench] wrote {output}; `python bench/table.py` updates docs/benchmarks.md from bench/results/")
    if not args.keep_work and not failed:
        shutil.rmtree(work_dir, ignore_errors=True)
    elif failed:
        print(f"[bench] a section failed: logs kept in {work_dir}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
