"""The join benchmark: TPC-H Q3 as join MVs over customer, orders and lineitem.

    python bench/joins.py [--scale 1] [--repeats 3] [--sections snapshot,refresh] [--output FILE]

Two MVs of Q3's join: `q3` (its revenue per order: GROUP BY over the join, the per-group
state of docs/aggregates.md) and `q3_rows` (the line items Q3 sums, one MV row per line
item: a stateless join keyed by lineitem's key). Loads TPC-H (customer, orders,
lineitem) at the scale factor into a scratch folder (tpchgen-cli, nothing downloaded),
builds one Spark session at `local[2]` with the engine's own settings, and measures,
side by side in that session, for each MV:

1. snapshot: `run_snapshot` at the loaded versions against a plain Spark job that reads
   the three Delta tables at the same versions, runs the same query and writes Parquet;
   one unmeasured run of each first, on the same tables (a smaller copy left the JIT
   compiler warming the engine's side through its first measured runs), then `--repeats` runs
   alternating which goes first; ratio of the medians;
2. catch-up: one RF1 (new orders with their line items) and one RF2 (deleted orders with
   their line items) commit to both `orders` and `lineitem`; `run_catch_up` brings the MV
   over those four versions, against recomputing the MV from scratch at the same
   versions (a snapshot into a new target); one unmeasured pair first, then `--repeats`
   pairs; ratio of the medians, and against the plain Spark job of section 1 at the same
   versions. Delta's cached table states are dropped before each measured side: the
   first side to read a new version would otherwise rebuild its state for the others.
   `--round-plan` sets the MVs' `round_plan` (auto by default, which recomputes when the
   job's snapshot says that beats the least a round costs; incremental to measure the
   rounds that apply their changes).

The session's JVM gets `--driver-memory` of heap (4g from SF 10 on, where the plain Spark
job and the recompute run out of Spark's default 1 GiB while sorting their Parquet writes).

Prints the figures and writes the run's JSON into bench/results/, named by date and commit
(`bench/run_record.py`); `python bench/table.py` puts them into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # `python bench/joins.py` puts bench/, not the checkout, on the path
    sys.path.insert(0, ROOT)

from airflow_backfill import tpch  # noqa: E402
from airflow_backfill.engine.spark_session import SUBMIT_ARGS_VARIABLE  # noqa: E402
from airflow_backfill.job import BackfillJob  # noqa: E402
from bench import run_record  # noqa: E402
from bench.measure import without_cached_states  # noqa: E402

LARGE_SCALE_HEAP = "4g"
"""The session's heap from SF 10 on (`--driver-memory` sets another)."""

Q3_JOIN = (
    "FROM customer, orders, lineitem WHERE c_mktsegment = 'BUILDING' AND c_custkey = o_custkey "
    "AND l_orderkey = o_orderkey AND o_orderdate < DATE '1995-03-15' AND l_shipdate > DATE '1995-03-15'"
)
QUERIES = {
    "q3": "SELECT l_orderkey, SUM(l_extendedprice * (1 - l_discount)) AS revenue, o_orderdate, o_shippriority "
          f"{Q3_JOIN} GROUP BY l_orderkey, o_orderdate, o_shippriority",
    "q3_rows": "SELECT l_orderkey, l_linenumber, l_extendedprice * (1 - l_discount) AS revenue, o_orderdate, "
               f"o_shippriority {Q3_JOIN}",
}
Q3 = QUERIES["q3"]


def driver_memory(value: str) -> str:
    """A JVM heap size as `--driver-memory` takes it (digits and a unit: 512m, 4g)."""
    if not re.fullmatch(r"[1-9][0-9]*[mMgG]", value):
        raise argparse.ArgumentTypeError(f"{value!r} is no heap size: give digits and a unit, e.g. 4g or 512m")
    return value.lower()


def q3_job(tables: tpch.TpchTables, name: str, target: str, query: str = Q3, round_plan: str = "auto") -> BackfillJob:
    return BackfillJob(
        name=name, target=target, query=query, backfill_parallelism=2, lag_threshold=0, round_plan=round_plan,
        sources={table: {"table": tables.path(table), "primary_key": list(tpch.PRIMARY_KEYS[table])}
                 for table in (tpch.CUSTOMER, tpch.ORDERS, tpch.LINEITEM)},
    )


def versions(tables: tpch.TpchTables) -> dict[str, int]:
    from deltalake import DeltaTable

    return {table: DeltaTable(tables.path(table)).version() for table in tpch.LOADABLE}


def plain_q3(spark: Any, tables: tpch.TpchTables, at: dict[str, int], out_dir: str, query: str = Q3) -> None:
    """The same query as a plain Spark job: the Delta tables as of `at`, Parquet out."""
    for table in tpch.LOADABLE:
        spark.read.format("delta").option("versionAsOf", at[table]).load(tables.path(table)) \
            .createOrReplaceTempView(table)
    spark.sql(query).write.mode("overwrite").parquet(out_dir)


def timed(function: Any, *args: Any, **kwargs: Any) -> float:
    started = time.monotonic()
    function(*args, **kwargs)
    return round(time.monotonic() - started, 3)


def snapshot_section(spark: Any, tables: tpch.TpchTables, work: str,
                     repeats: int, kind: str) -> dict[str, Any]:
    from airflow_backfill.engine.phases.snapshot import run_snapshot

    query = QUERIES[kind]
    loaded = versions(tables)
    run_snapshot(spark, q3_job(tables, f"warm_{kind}", os.path.join(work, f"warm-{kind}"), query), epochs=loaded)
    plain_q3(spark, tables, loaded, os.path.join(work, "warm-plain"), query)
    shutil.rmtree(os.path.join(work, f"warm-{kind}"), ignore_errors=True)
    shutil.rmtree(os.path.join(work, "warm-plain"), ignore_errors=True)
    engine_runs: list[float] = []
    plain_runs: list[float] = []
    for run in range(repeats):
        target, out_dir = os.path.join(work, f"{kind}-{run}"), os.path.join(work, f"plain-{run}")
        job = q3_job(tables, f"{kind}_{run}", target, query)
        sides = [("engine", lambda j=job: run_snapshot(spark, j, epochs=loaded)),
                 ("plain", lambda o=out_dir: plain_q3(spark, tables, loaded, o, query))]
        for side, measure in sides if run % 2 == 0 else reversed(sides):
            (engine_runs if side == "engine" else plain_runs).append(timed(measure))
        shutil.rmtree(target, ignore_errors=True)
        shutil.rmtree(out_dir, ignore_errors=True)
    engine, plain = statistics.median(engine_runs), statistics.median(plain_runs)
    return {"engine_s": engine_runs, "plain_s": plain_runs, "engine_median_s": round(engine, 3),
            "plain_median_s": round(plain, 3), "ratio": round(engine / plain, 2)}


def refresh_section(spark: Any, tables: tpch.TpchTables, work: str, repeats: int, seed: int,
                    kind: str, round_plan: str = "auto") -> dict[str, Any]:
    from airflow_backfill.engine.phases.catch_up import run_catch_up
    from airflow_backfill.engine.phases.snapshot import run_snapshot

    query = QUERIES[kind]

    def recompute(name: str) -> float:
        target = os.path.join(work, name)
        without_cached_states(spark)
        seconds = timed(run_snapshot, spark, q3_job(tables, name.replace("-", "_"), target, query),
                        epochs=versions(tables))
        shutil.rmtree(target, ignore_errors=True)
        return seconds

    def plain(name: str) -> float:
        out_dir = os.path.join(work, name)
        without_cached_states(spark)
        seconds = timed(plain_q3, spark, tables, versions(tables), out_dir, query)
        shutil.rmtree(out_dir, ignore_errors=True)
        return seconds

    recompute(f"warm-recompute-{kind}")  # unmeasured: the job's own snapshot below runs warm, as its rounds do
    plain(f"warm-plain-{kind}")
    job = q3_job(tables, f"{kind}_refresh", os.path.join(work, f"{kind}-refresh"), query, round_plan)
    initial_s = timed(run_snapshot, spark, job)
    tpch.insert_new_orders(tables, seed)
    tpch.delete_old_orders(tables, seed)
    run_catch_up(spark, job)  # unmeasured: the first round of this size compiles its code paths
    pairs: list[dict[str, Any]] = []
    for run in range(repeats):
        rf1 = tpch.insert_new_orders(tables, seed)
        rf2 = tpch.delete_old_orders(tables, seed)
        without_cached_states(spark)
        started = time.monotonic()
        caught_up = run_catch_up(spark, job)
        catch_up_s = round(time.monotonic() - started, 3)
        sides = [("recompute_s", lambda r=run: recompute(f"recompute-{kind}-{r}")),
                 ("plain_s", lambda r=run: plain(f"plain-{kind}-{r}"))]
        measured = {name: measure() for name, measure in (sides if run % 2 == 0 else reversed(sides))}
        pairs.append({"inserted_orders": rf1.orders, "inserted_lineitems": rf1.lineitems,
                      "deleted_orders": rf2.orders, "deleted_lineitems": rf2.lineitems,
                      "rounds": len(caught_up.rounds), "plans": [r.plan for r in caught_up.rounds],
                      "change_rows": sum(r.change_rows for r in caught_up.rounds),
                      "catch_up_s": catch_up_s, **measured})
    catch_up = statistics.median(p["catch_up_s"] for p in pairs)
    recomputed = statistics.median(p["recompute_s"] for p in pairs)
    plain_s = statistics.median(p["plain_s"] for p in pairs)
    return {"round_plan": round_plan, "initial_snapshot_s": initial_s, "pairs": pairs,
            "catch_up_median_s": round(catch_up, 3), "recompute_median_s": round(recomputed, 3),
            "plain_median_s": round(plain_s, 3), "speedup": round(recomputed / catch_up, 2),
            "speedup_vs_plain": round(plain_s / catch_up, 2)}


def with_load(section: Any, *args: Any) -> dict[str, Any]:
    """A section's figures with the machine's load before and after it."""
    before = os.getloadavg()
    figures: dict[str, Any] = section(*args)
    return {**figures, "load_average_before": before, "load_average_after": os.getloadavg()}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python bench/joins.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kinds", default=",".join(QUERIES), help=f"comma-separated MVs of {', '.join(QUERIES)}")
    parser.add_argument("--sections", default="snapshot,refresh",
                        help="comma-separated sections of snapshot, refresh (SF 10's refreshes take most of its "
                             "24 minutes and about 30 GB of disk)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--round-plan", default="auto", choices=("auto", "incremental", "recompute"),
                        help="the MVs' round_plan in the refresh section (auto: recompute when cheaper)")
    parser.add_argument("--driver-memory", type=driver_memory, default=None,
                        help="the session's JVM heap, e.g. 4g (default: 4g from SF 10 on, Spark's 1g below)")
    parser.add_argument("--output", default=None,
                        help="JSON result file (default: bench/results/<date>-<time>-<commit>-joins.json)")
    parser.add_argument("--work-dir", default=None, help="scratch folder (default: a new temporary one, removed)")
    args = parser.parse_args(argv)
    sections = {s for s in args.sections.split(",") if s}
    if not sections or sections - {"snapshot", "refresh"}:
        parser.error(f"--sections takes snapshot and/or refresh, got {args.sections!r}")
    from airflow_backfill.engine.spark_session import build_spark_session

    memory = args.driver_memory or (LARGE_SCALE_HEAP if args.scale >= 10 else None)
    if memory is not None:  # read by pyspark when it launches the session's JVM
        os.environ[SUBMIT_ARGS_VARIABLE] = f"--driver-memory {memory} " + os.environ.get(SUBMIT_ARGS_VARIABLE,
                                                                                      "pyspark-shell")
    work = args.work_dir or tempfile.mkdtemp(prefix="airflow_backfill-joins-bench-")
    meta = {**run_record.run_meta("joins", "joins.py", argv), "scale_factor": args.scale,
            "sections": sorted(sections), "repeats": args.repeats, "round_plan": args.round_plan}
    run_started = time.monotonic()
    try:
        started = time.monotonic()
        tables = tpch.load_tpch(os.path.join(work, "tpch"), args.scale, tables=tpch.LOADABLE)
        load_s = round(time.monotonic() - started, 1)
        spark = build_spark_session("airflow_backfill-bench-joins", parallelism=2)
        try:
            results: dict[str, Any] = {"scale_factor": args.scale, "parallelism": 2, "load_s": load_s,
                                       "driver_memory": memory or "1g", "cpus": os.cpu_count(),
                                       "load_average_before": os.getloadavg()}
            for kind in (k for k in args.kinds.split(",") if k):
                results[kind] = {}
                if "snapshot" in sections:
                    results[kind]["snapshot"] = with_load(snapshot_section, spark, tables, work, args.repeats,
                                                          kind)
                if "refresh" in sections:
                    results[kind]["refresh"] = with_load(refresh_section, spark, tables, work, args.repeats,
                                                         args.seed, kind, args.round_plan)
            results["load_average_after"] = os.getloadavg()
        finally:
            spark.stop()
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    output = run_record.write_result(
        {"meta": run_record.finish_meta(meta, time.monotonic() - run_started), **results}, args.output)
    print(f"wrote {output}; `python bench/table.py` updates docs/benchmarks.md from bench/results/")
    for kind in (k for k in QUERIES if k in results):
        if "snapshot" in results[kind]:
            snapshot = results[kind]["snapshot"]
            print(f"scale factor {args.scale:g}, {kind}: snapshot {snapshot['engine_median_s']}s vs plain Spark "
                  f"{snapshot['plain_median_s']}s (x{snapshot['ratio']})")
        if "refresh" in results[kind]:
            refresh = results[kind]["refresh"]
            print(f"scale factor {args.scale:g}, {kind} (round_plan {refresh['round_plan']}): RF1+RF2 catch-up "
                  f"{refresh['catch_up_median_s']}s vs recompute {refresh['recompute_median_s']}s "
                  f"({refresh['speedup']}x faster), vs plain Spark {refresh['plain_median_s']}s "
                  f"({refresh['speedup_vs_plain']}x faster); plans {[p['plans'] for p in refresh['pairs']]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
