"""Snapshot and catch-up with the tables on the loopback S3 server against local files.

    python bench/object_store.py [--rows 200000] [--epochs 10] [--repeats 2] [--parallelism 2]

Starts moto's S3 server on 127.0.0.1, writes the same `orders` upstream (the simulator,
same seed) to a local folder and to a bucket, then in one SparkSession, after one
unmeasured snapshot and catch-up per side, alternating which side goes first in each
repeat:

- snapshot: `run_snapshot` of a stateless MV into a new target on the same side;
- catch-up: after `--epochs` identical epochs on both upstreams, `run_catch_up` of each
  MV of that repeat (one round, lag threshold 0).

Prints the run's JSON (the medians and the S3 / local ratios) and writes it into
bench/results/, named by date and commit (`bench/run_record.py`). The S3 server is a
single Python process on the same two cores, so the ratio is an upper bound of what the
protocol costs, not a prediction for a real object store.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

QUERY = "SELECT order_id, customer_id, status, amount * quantity AS total FROM source WHERE status <> 'cancelled'"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python bench/object_store.py", description=__doc__)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--updates", type=int, default=500, help="updated orders per epoch (plus 1/5 inserts, deletes)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--output", default=None,
                        help="JSON result file (default: bench/results/<date>-<time>-<commit>-object_store.json)")
    args = parser.parse_args(argv)
    from bench import run_record

    meta = run_record.run_meta("object_store", "object_store.py", argv)
    run_started = time.monotonic()

    from airflow_backfill.engine.phases.catch_up import run_catch_up
    from airflow_backfill.engine.phases.snapshot import run_snapshot
    from airflow_backfill.engine.spark_session import build_spark_session
    from airflow_backfill.job import BackfillJob
    from airflow_backfill.simulator import commit_epoch, create_orders_table
    from airflow_backfill.storage.loopback_s3 import loopback_s3

    work = Path(tempfile.mkdtemp(prefix="object-store-bench-"))
    try:
        with loopback_s3(work) as server:
            os.environ.update({**server.settings().environment(), "AWS_ALLOW_HTTP": "true"})
            roots = {"local": str(work / "tables"), "s3": f"s3://{server.new_bucket()}/tables"}
            started = time.monotonic()
            for root in roots.values():
                create_orders_table(f"{root}/orders", rows=args.rows, seed=1)
            load_seconds = time.monotonic() - started
            spark = build_spark_session("object-store-bench", args.parallelism)

            def job(side: str, repeat: int) -> BackfillJob:
                return BackfillJob(name=f"bench_{repeat}", source=f"{roots[side]}/orders",
                                   target=f"{roots[side]}/mv_{repeat}", query=QUERY, primary_key=("order_id",),
                                   backfill_parallelism=args.parallelism, parallelism=args.parallelism)

            def timed(action, *call_args) -> float:  # type: ignore[no-untyped-def]
                started = time.monotonic()
                action(spark, *call_args)
                return time.monotonic() - started

            order = [("local", "s3"), ("s3", "local")]
            snapshot: dict[str, list[float]] = {"local": [], "s3": []}
            catch_up: dict[str, list[float]] = {"local": [], "s3": []}
            warm_up = args.repeats  # one unmeasured MV per side: the JVM's first plans are slow
            for side in ("local", "s3"):
                timed(run_snapshot, job(side, warm_up))
            for repeat in range(args.repeats):
                for side in order[repeat % 2]:
                    snapshot[side].append(timed(run_snapshot, job(side, repeat)))
            for side in ("local", "s3"):
                rng = random.Random(2)
                for _ in range(args.epochs):
                    commit_epoch(f"{roots[side]}/orders", rng, inserts=args.updates // 5, updates=args.updates,
                                 deletes=args.updates // 5)
            for side in ("local", "s3"):
                timed(run_catch_up, job(side, warm_up))
            for repeat in range(args.repeats):
                for side in order[repeat % 2]:
                    catch_up[side].append(timed(run_catch_up, job(side, repeat)))
            spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def summary(times: dict[str, list[float]]) -> dict[str, object]:
        local, s3 = statistics.median(times["local"]), statistics.median(times["s3"])
        return {"local_s": [round(t, 2) for t in times["local"]], "s3_s": [round(t, 2) for t in times["s3"]],
                "local_median_s": round(local, 2), "s3_median_s": round(s3, 2), "s3_over_local": round(s3 / local, 2)}

    result = {
        "meta": run_record.finish_meta(meta, time.monotonic() - run_started),
        "rows": args.rows, "epochs": args.epochs, "updates_per_epoch": args.updates, "repeats": args.repeats,
        "parallelism": args.parallelism, "load_seconds": round(load_seconds, 1), "load_average": os.getloadavg(),
        "snapshot": summary(snapshot), "catch_up": summary(catch_up),
    }
    print(json.dumps(result, indent=2))
    print(f"wrote {run_record.write_result(result, args.output)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
