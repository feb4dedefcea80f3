"""MV-on-MV chains: how large each link's change feed is, and what each round costs, for a
small upstream change; and what a fresh process's first round of each plan costs.

    python bench/chain.py [--scale 0.33] [--share 0.005] [--repeats 2] [--sections chain,cold]

Loads TPC-H `lineitem` at the scale factor (0.33: about 2 M rows) and runs every phase as
its own `spark-submit`, as a DAG runs them (on the JVM class archive when one is built,
the catch-up with the JIT compiler the catch-up operator would choose):

- `chain`: three MVs, each over the one before: `mv1` stateless over lineitem, `mv2`
  stateless over `mv1`, `mv3` an aggregate over `mv2`. Each repeat gives `--share` of the
  line items a new discount (one commit), then catches up `mv1`, `mv2`, `mv3` in turn.
  For each link: the rows of the MV's change feed for that catch-up (Spark's reader), the
  MV rows that changed (the MV before and after, compared), their ratio, the round's plan,
  estimate and seconds, and the process's wall time. Repeats alternate between the MVs
  counting their readers (as the engine does) and not (the readers' registrations
  removed before each catch-up: what rounds chose before they counted them).
- `cold`: for a stateless MV over lineitem (plans `incremental`, `merge`, `recompute`,
  and `recompute` with three readers registered, which writes only the difference) and
  the TPC-H Q1 aggregate (`incremental`, `recompute`), each repeat commits two such
  changes and runs one catch-up of one epoch a round: its first round is the process's
  first (cold), its second runs warm. Their difference is the plan's first use, the
  figure `Rates.first_use` holds; the warm recomputes with and without the difference
  give what comparing the MV's rows costs (`Rates.per_compared_row`).

Prints the run's JSON and writes it into bench/results/, named by date and commit
(`bench/run_record.py`); docs/round-plans.md ("The MV's readers", "A fresh process and its
first rounds") says what the figures mean and holds the `cold` ones.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python bench/chain.py` puts bench/, not the checkout, on the path
    sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from bench import run_record  # noqa: E402
from bench.submit import spark_submit, submit_env  # noqa: E402
from bench.workload import LINEITEM_KEY, Q1_QUERY  # noqa: E402

SECTIONS = ("chain", "cold")
PHASE = str(ROOT / "spark_jobs" / "{}.py")
CHAIN = {  # name: (source: the upstream or an MV of the chain, query, primary key)
    "mv1": ("lineitem", "SELECT l_orderkey, l_linenumber, l_extendedprice * (1 - l_discount) AS disc_price, "
                        "l_discount, l_shipdate FROM source", list(LINEITEM_KEY)),
    "mv2": ("mv1", "SELECT l_orderkey, l_linenumber, disc_price * 2 AS doubled, l_shipdate FROM source "
                   "WHERE l_discount < 0.1", list(LINEITEM_KEY)),
    "mv3": ("mv2", "SELECT l_shipdate, COUNT(*) AS items, SUM(doubled) AS total FROM source GROUP BY l_shipdate",
            list(LINEITEM_KEY)),
}
MV_KEYS = {"mv1": list(LINEITEM_KEY), "mv2": list(LINEITEM_KEY), "mv3": ["l_shipdate"]}
COLD = {  # name: (query, round_plan, registered readers)
    "stateless_incremental": (CHAIN["mv1"][1], "incremental", 0),
    "stateless_merge": (CHAIN["mv1"][1], "merge", 0),
    "stateless_recompute": (CHAIN["mv1"][1], "recompute", 0),
    "stateless_recompute_difference": (CHAIN["mv1"][1], "recompute", 3),
    "aggregate_incremental": (Q1_QUERY, "incremental", 0),
    "aggregate_recompute": (Q1_QUERY, "recompute", 0),
}
"""With three readers registered, a recompute of the 2 M-row MV writes only its difference
(the estimates make three whole-table feeds cost more than the comparison)."""


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python bench/chain.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=0.33, help="TPC-H scale factor (0.33: about 2 M line items)")
    parser.add_argument("--share", type=float, default=0.005, help="share of the line items updated per change")
    parser.add_argument("--repeats", type=int, default=2, help="changes per mode (chain) or per plan (cold)")
    parser.add_argument("--parallelism", type=int, default=2, help="backfill parallelism of every phase")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--work-dir", default=None, help="scratch folder (default: a new temporary one)")
    parser.add_argument("--keep-work", action="store_true")
    parser.add_argument("--output", default=None,
                        help="JSON result file (default: bench/results/<date>-<time>-<commit>-chain.json)")
    args = parser.parse_args(argv)
    args.sections = tuple(s for s in args.sections.split(",") if s)
    if set(args.sections) - set(SECTIONS):
        parser.error(f"unknown section(s) {sorted(set(args.sections) - set(SECTIONS))}; choose from {SECTIONS}")
    if args.repeats < 1 or not 0 < args.share <= 1:
        parser.error("--repeats must be 1 or more and --share in (0, 1]")
    return args


def job_file(work: Path, name: str, source: str, query: str, key: list[str], parallelism: int,
             **fields: Any) -> tuple[str, str]:
    """A job file for MV `name` under `work`; (its path, the MV's path)."""
    target = str(work / "mv" / name)
    job = {"name": f"bench_chain_{name}", "source": source, "target": target, "query": query, "primary_key": key,
           "backfill_parallelism": parallelism, "lag_threshold": 0, **fields}
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job))
    return str(path), target


def catch_up(path: str, parallelism: int) -> float:
    """One catch-up as the DAG's task starts it; its wall time."""
    from airflow_backfill.engine.launch.class_archive import archive_launch
    from bench.submit import _catch_up_jit_is_quick

    on_archive = archive_launch(submit_env()) is not None
    return spark_submit(parallelism, PHASE.format("catch_up"), "--job", path, on_archive=on_archive,
                        quick_jit=_catch_up_jit_is_quick(path))


def snapshot(path: str, parallelism: int) -> float:
    from airflow_backfill.engine.launch.class_archive import archive_launch

    return spark_submit(parallelism, PHASE.format("snapshot"), "--job", path,
                        on_archive=archive_launch(submit_env()) is not None)


def last_rounds(target: str) -> list[dict[str, Any]]:
    """The catch-up's rounds (plan, seconds) with each one's estimate from the round costs."""
    from airflow_backfill.engine import job_state

    state = job_state.read_state(target)
    costs = {entry.get("epoch"): entry for entry in state.get("round_costs", [])}
    rounds = []
    for entry in state.get("catch_up_rounds", []):
        cost = costs.get(entry.get("watermark"), {})
        rounds.append({"plan": entry.get("plan"), "seconds": entry.get("seconds"),
                       "change_rows": entry.get("change_rows"), "estimate_s": cost.get("estimate_s")})
    return rounds


def feed_rows(spark: Any, target: str, after: int, last: int) -> int:
    """Rows of the MV's change feed in versions (after, last], as Spark reads them."""
    if last <= after:
        return 0
    return (spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", after + 1)
            .option("endingVersion", last).load(target).count())


def changed_rows(spark: Any, target: str, before: int, after: int, key: list[str]) -> int:
    """MV keys whose row was added, removed or changed between the two versions."""
    old = spark.read.format("delta").option("versionAsOf", before).load(target)
    new = spark.read.format("delta").option("versionAsOf", after).load(target)
    differing = new.exceptAll(old).select(*key).unionByName(old.exceptAll(new).select(*key))
    return differing.distinct().count()


def register_readers(target: str, count: int) -> None:
    """Register `count` stand-in readers with the MV (each names the MV itself as its
    target, which exists, so each counts), as jobs over it would register."""
    from airflow_backfill.engine.downstream import readers_dir

    for number in range(count):
        entry = {"job": f"stand_in_{number}", "target": target, "round_plan": "auto", "registered_at": time.time()}
        path = Path(readers_dir(target), f"stand_in_{number}.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(entry))


def remove_readers(target: str) -> None:
    from airflow_backfill.engine.downstream import readers_dir

    shutil.rmtree(readers_dir(target), ignore_errors=True)


def run_chain(work: Path, tables: Any, args: argparse.Namespace, spark: Any) -> dict[str, Any]:
    from deltalake import DeltaTable

    from airflow_backfill import tpch

    lineitem = tables.lineitem
    files: dict[str, str] = {}
    targets: dict[str, str] = {}
    for name, (source, query, key) in CHAIN.items():
        upstream = lineitem if source == "lineitem" else targets[source]
        files[name], targets[name] = job_file(work, name, upstream, query, key, args.parallelism)
    snapshots = {name: snapshot(files[name], args.parallelism) for name in CHAIN}
    repeats: list[dict[str, Any]] = []
    for repeat in range(2 * args.repeats):
        mode = "readers counted" if repeat % 2 == 0 else "readers not counted"
        updated, _ = tpch.update_lineitems(tables, args.seed + repeat, args.share)
        links: dict[str, dict[str, Any]] = {}
        for name in CHAIN:
            if mode == "readers not counted":
                remove_readers(targets[name])
            before = DeltaTable(targets[name]).version()
            process_s = catch_up(files[name], args.parallelism)
            after = DeltaTable(targets[name]).version()
            rounds = last_rounds(targets[name])
            feed = feed_rows(spark, targets[name], before, after)
            changed = changed_rows(spark, targets[name], before, after, MV_KEYS[name])
            links[name] = {"process_s": process_s, "rounds": rounds,
                           "round_s": round(sum(r["seconds"] or 0.0 for r in rounds), 3),
                           "feed_rows": feed, "changed_rows": changed,
                           "feed_rows_per_changed_row": round(feed / changed, 2) if changed else None}
        first = links["mv1"]["round_s"]
        for name in ("mv2", "mv3"):
            links[name]["round_over_mv1"] = round(links[name]["round_s"] / first, 2) if first else None
        repeats.append({"mode": mode, "updated_rows": updated, "links": links})
    return {"snapshot_s": snapshots, "repeats": repeats, "summary": chain_summary(repeats)}


def chain_summary(repeats: list[dict[str, Any]]) -> dict[str, Any]:
    """Per mode and link: the median feed rows per changed row and round time over mv1's."""
    summary: dict[str, Any] = {}
    for mode in sorted({r["mode"] for r in repeats}):
        runs = [r for r in repeats if r["mode"] == mode]
        per_link = {}
        for name in CHAIN:
            ratios = [r["links"][name]["feed_rows_per_changed_row"] for r in runs
                      if r["links"][name]["feed_rows_per_changed_row"] is not None]
            link: dict[str, Any] = {
                "feed_rows": [r["links"][name]["feed_rows"] for r in runs],
                "changed_rows": [r["links"][name]["changed_rows"] for r in runs],
                "feed_rows_per_changed_row_median": round(statistics.median(ratios), 2) if ratios else None,
                "round_s_median": round(statistics.median(r["links"][name]["round_s"] for r in runs), 3),
                "process_s_median": round(statistics.median(r["links"][name]["process_s"] for r in runs), 3),
                "plans": [[round_["plan"] for round_ in r["links"][name]["rounds"]] for r in runs],
            }
            if name != "mv1":
                link["round_over_mv1_median"] = round(statistics.median(
                    r["links"][name]["round_over_mv1"] for r in runs), 2)
            per_link[name] = link
        summary[mode] = per_link
    return summary


def run_cold(work: Path, tables: Any, args: argparse.Namespace) -> dict[str, Any]:
    from airflow_backfill import tpch

    lineitem = tables.lineitem
    files: dict[str, str] = {}
    targets: dict[str, str] = {}
    for name, (query, plan, readers) in COLD.items():
        key = list(LINEITEM_KEY)
        files[name], targets[name] = job_file(work, f"cold_{name}", lineitem, query, key, args.parallelism,
                                              round_plan=plan, max_round_epochs=1)
        snapshot(files[name], args.parallelism)
        register_readers(targets[name], readers)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in COLD}
    for repeat in range(args.repeats):
        for change in range(2):
            tpch.update_lineitems(tables, args.seed + 100 + 2 * repeat + change, args.share)
        for name in COLD:
            process_s = catch_up(files[name], args.parallelism)
            rounds = last_rounds(targets[name])
            runs[name].append({"process_s": process_s, "rounds": rounds})
    summary = {}
    for name, entries in runs.items():
        cold = [e["rounds"][0]["seconds"] for e in entries if len(e["rounds"]) >= 2]
        warm = [statistics.median(r["seconds"] for r in e["rounds"][1:]) for e in entries if len(e["rounds"]) >= 2]
        summary[name] = {"cold_round_s": cold, "warm_round_s": [round(w, 3) for w in warm],
                         "first_use_s_median": round(statistics.median(c - w for c, w in zip(cold, warm, strict=True)),
                                                     2) if cold else None,
                         "plans": [[r["plan"] for r in e["rounds"]] for e in entries],
                         "estimates_s": [[r["estimate_s"] for r in e["rounds"]] for e in entries]}
    return {"runs": runs, "summary": summary}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    meta = run_record.run_meta("chain", "chain.py", argv)
    started = time.monotonic()
    from airflow_backfill import tpch
    from airflow_backfill.engine.spark_session import build_spark_session

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="chain-bench-"))
    result: dict[str, Any] = {"scale": args.scale, "share": args.share, "repeats": args.repeats,
                              "parallelism": args.parallelism}
    spark = None
    try:
        loaded = time.monotonic()
        tables = tpch.load_tpch(str(work / "tpch"), args.scale, tables=("lineitem",))
        result["load_s"] = round(time.monotonic() - loaded, 1)
        from deltalake import DeltaTable

        result["lineitem_rows"] = DeltaTable(tables.lineitem).to_pyarrow_dataset().count_rows()
        if "cold" in args.sections:
            result["cold"] = run_cold(work, tables, args)
        if "chain" in args.sections:
            spark = build_spark_session("chain-bench-reader", 1)  # reads the feeds between the phases' processes
            result["chain"] = run_chain(work, tables, args, spark)
    finally:
        if spark is not None:
            spark.stop()
        if not args.keep_work and not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    result = {"meta": run_record.finish_meta(meta, time.monotonic() - started), **result}
    print(json.dumps({k: v for k, v in result.items() if k != "meta"}, indent=1))
    print(f"wrote {run_record.write_result(result, args.output)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
