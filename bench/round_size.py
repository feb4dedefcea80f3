"""A forward round of 500 changed rows on a large MV and on a small one, side by side.

    python bench/round_size.py [--sizes 20000,2000000] [--repeats 5] [--warm-up 2]

For each size, the users' `orders` upstream (bench/user_tables.py: an int key, decimal,
double, timestamp, boolean and string columns) created by delta-rs in files of about a
million rows, and a stateless MV with a WHERE over it, snapshotted by the engine. Then, in
turns that alternate the sizes, a users' writer changes 500 rows of each upstream in two
delta-rs commits (50 scattered keys deleted; a MERGE that updates 400 scattered keys and
re-inserts 50 deleted before) and the MV is caught up in one round, as the forward's
round applies them (`run_catch_up`: feed, netting, key check, plan, write, commit), warm:
`--warm-up` such rounds per size are not measured. A plain Spark recompute of the query
at the same upstream version (read, query, overwrite a Delta table) runs beside each
measured round, first or second in turn. Each round's rows written are read from the MV's
log; at the end every MV is compared with its query evaluated by the tests' oracle (DuckDB) on
the upstream as of the MV's watermark.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python bench/round_size.py` puts bench/, not the checkout, on the path
    sys.path.insert(0, str(ROOT))

from bench import run_record  # noqa: E402

QUERY = ("SELECT order_id, customer_code, status, amount, discount, priority, ordered_at FROM source "
         "WHERE status <> 'cancelled'")
DELETED, UPDATED, REINSERTED = 50, 400, 50
"""A round's 500 changed rows."""
PARALLELISM = 2
ROUND_TARGET_S = 0.5
"""The warm round on the large MV takes at most this long..."""
SIZE_RATIO_TARGET = 1.5
"""...and at most this many times the same round on the small one: a round costs what
changed, not the MV's size."""


class Sized:
    """One size: its upstream, its writer's key book and its MV's job."""

    def __init__(self, work: Path, rows: int, seed: int) -> None:
        from bench import delta_rs_writer
        from bench.user_tables import TABLES
        from bench.writers import Upstream, initial_rows

        self.rows = rows
        table = TABLES["orders"]
        uri = str(work / f"orders_{rows}")
        delta_rs_writer.create(uri, initial_rows(table, rows, seed), {"bench.rows": str(rows)})
        self.upstream = Upstream.open(table, uri, seed)
        self.target = str(work / f"mv_{rows}")
        self.plain_target = str(work / f"plain_{rows}")
        self.job = _job(uri, self.target, rows)

    def change_500_rows(self, engine: Any) -> int:
        """Delete 50 scattered keys, then update 400 and re-insert 50 deleted before (new
        keys in the first turn) in one MERGE; the upstream's version after both."""
        from bench.commit_mix import DELETE, UPSERT, CommitPlan, fresh, sample_deleted, sample_live
        from bench.writers import KIND_FIELD, latest_version

        upstream = self.upstream
        book, rng = upstream.book, upstream.rng
        again = sample_deleted(rng, book, REINSERTED)
        deleted = sample_live(rng, book, DELETED)
        updated = sorted(set(sample_live(rng, book, UPDATED + DELETED)) - set(deleted))[:UPDATED]
        plans = [CommitPlan(DELETE, deleted=tuple(deleted)),
                 CommitPlan(UPSERT, inserted=tuple(again + fresh(book, REINSERTED - len(again))),
                            updated=tuple(updated))]
        for plan in plans:
            rows = upstream.rows_for(plan) if plan.kind == UPSERT else upstream.table.schema.empty_table()
            engine.commit(upstream.table, upstream.uri, plan, rows, {KIND_FIELD: plan.kind})
            book.apply(plan)
        return latest_version(upstream.uri)


def _job(source: str, target: str, rows: int) -> Any:
    from airflow_backfill.job import BackfillJob

    return BackfillJob(name=f"orders_open_{run_record.rows_label(rows)}", source=source, target=target, query=QUERY,
                       primary_key=("order_id",), backfill_parallelism=PARALLELISM, parallelism=PARALLELISM)


def timed_round(spark: Any, sized: Sized, clock: Any) -> dict[str, Any]:
    """One catch-up of the pending change: seconds, JVM CPU seconds, plans, rows written."""
    from airflow_backfill.engine.phases.catch_up import run_catch_up
    from bench.mv_writes import mv_commits

    before = max(commit.version for commit in mv_commits(sized.target, sized.job.app_id))
    started, cpu = time.perf_counter(), clock.cpu()
    caught_up = run_catch_up(spark, sized.job, parallelism=PARALLELISM)
    seconds, cpu_s = time.perf_counter() - started, clock.cpu() - cpu
    written = [commit for commit in mv_commits(sized.target, sized.job.app_id) if commit.version > before]
    return {"seconds": round(seconds, 3), "jvm_cpu_s": round(cpu_s, 3), "rounds": len(caught_up.rounds),
            "plans": [r.plan for r in caught_up.rounds], "change_rows": sum(r.change_rows for r in caught_up.rounds),
            "rows_written": sum(commit.rows_written for commit in written),
            "whole_mv_rewrites": sum(commit.whole_rewrite for commit in written)}


def timed_plain(spark: Any, sized: Sized, version: int) -> float:
    from bench.measure import stopwatch
    from bench.workload import plain_recompute

    with stopwatch() as elapsed:
        plain_recompute(spark, sized.upstream.uri, version, QUERY, sized.plain_target)
    return round(elapsed(), 3)


def differences(sized: Sized) -> int:
    """Problems the tests' oracle (DuckDB, bench/exactness.py) finds between the MV and its
    query on the upstream as of the MV's watermark: 0 when they are equal."""
    from bench.exactness import TESTS, problems_at

    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    job = {"name": sized.job.name, "source": sized.job.source, "target": sized.target, "query": QUERY,
           "primary_key": list(sized.job.primary_key)}
    return len(problems_at(job, None, None))


def measure(work: Path, sizes: list[int], repeats: int, warm_up: int, seed: int) -> dict[str, Any]:
    from airflow_backfill.engine.phases.snapshot import run_snapshot
    from airflow_backfill.engine.spark_session import build_spark_session
    from bench.measure import stopwatch
    from bench.snapshot_layout import JvmClock
    from bench.writers import delta_rs_engine

    spark = build_spark_session("bench:round_size", PARALLELISM)
    clock, engine = JvmClock(), delta_rs_engine()
    every = [Sized(work, rows, seed) for rows in sizes]
    snapshots = {}
    for sized in every:
        with stopwatch() as elapsed:
            run_snapshot(spark, sized.job, parallelism=PARALLELISM)
        snapshots[sized.rows] = round(elapsed(), 3)
    for _ in range(warm_up):  # class loading, code generation, the first Delta states
        for sized in every:
            version = sized.change_500_rows(engine)
            timed_round(spark, sized, clock)
            timed_plain(spark, sized, version)
    runs: dict[int, list[dict[str, Any]]] = {sized.rows: [] for sized in every}
    for turn in range(repeats):
        for sized in every if turn % 2 == 0 else list(reversed(every)):
            version = sized.change_500_rows(engine)
            plain_first = turn % 2 == 1
            plain_s = timed_plain(spark, sized, version) if plain_first else 0.0
            measured = timed_round(spark, sized, clock)
            if not plain_first:
                plain_s = timed_plain(spark, sized, version)
            runs[sized.rows].append({**measured, "plain_s": plain_s, "plain_first": plain_first})
    by_size = {run_record.rows_label(sized.rows): summary(runs[sized.rows], snapshots[sized.rows],
                                                          differences(sized)) for sized in every}
    spark.stop()
    out: dict[str, Any] = {"parallelism": PARALLELISM, "changed_rows": DELETED + UPDATED + REINSERTED,
                           "repeats": repeats, "warm_up": warm_up, "sizes": by_size}
    if len(by_size) == 2:
        small, large = (size["round_median_s"] for size in by_size.values())
        out["large_to_small"] = round(large / small, 2)
    return out


def summary(runs: list[dict[str, Any]], snapshot_s: float, differ: int) -> dict[str, Any]:
    """One size's medians over its measured rounds, and every round."""
    seconds = statistics.median(run["seconds"] for run in runs)
    plain_s = statistics.median(run["plain_s"] for run in runs)
    return {
        "snapshot_s": snapshot_s, "round_median_s": round(seconds, 3), "round_max_s": max(run["seconds"] for run in runs),
        "jvm_cpu_median_s": round(statistics.median(run["jvm_cpu_s"] for run in runs), 3),
        "plain_median_s": round(plain_s, 3), "speedup": round(plain_s / seconds, 2),
        "rows_written_max": max(run["rows_written"] for run in runs),
        "whole_mv_rewrites": sum(run["whole_mv_rewrites"] for run in runs), "differences": differ, "runs": runs,
    }


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(item) for item in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sizes takes row counts like 20000,2000000, got {text!r}") from None
    if not sizes or len(sizes) > 2 or any(size < 1000 for size in sizes):
        raise argparse.ArgumentTypeError(f"--sizes takes one or two row counts of at least 1000, got {text!r}")
    return sizes


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python bench/round_size.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=parse_sizes, default=[20_000, 2_000_000],
                        help="upstream (and MV) rows, small then large (default 20000,2000000)")
    parser.add_argument("--repeats", type=int, default=5, help="measured rounds per size (medians)")
    parser.add_argument("--warm-up", type=int, default=2, help="unmeasured rounds per size first")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--work-dir", default=None, help="scratch folder (default: a new temporary one)")
    parser.add_argument("--output", default=None, help="result file (default: bench/results/, by date and commit)")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.warm_up < 0:
        parser.error("--repeats must be 1 or more and --warm-up 0 or more")
    meta = run_record.run_meta("round_size", "round_size.py", argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="round_size-", dir=args.work_dir) as work:
        measured = measure(Path(work), args.sizes, args.repeats, args.warm_up, args.seed)
    result = {"meta": run_record.finish_meta(meta, time.monotonic() - started), "round_size": measured}
    print(json.dumps({label: {k: v for k, v in size.items() if k != "runs"}
                      for label, size in measured["sizes"].items()}, indent=1))
    print(f"large / small: {measured.get('large_to_small')}")
    print(f"wrote {run_record.write_result(result, args.output)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
