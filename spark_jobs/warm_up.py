"""spark-submit entry point that runs a small backfill once, for `airflow-backfill jvm-archive`.

    spark-submit spark_jobs/warm_up.py [--rows N]

A stateless MV and an aggregate MV over a generated `orders` table in a temporary
folder: snapshot, two upstream epochs, catch-up, and the MVs read back. The JVM that runs
it loads the classes a phase loads; started with `-XX:ArchiveClassesAtExit`, it archives
them for the phases' drivers (airflow_backfill/engine/launch/class_archive.py). Nothing outside
the temporary folder is written.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile

from airflow_backfill.spark_jobs.common import log, run_phase

QUERIES = {
    "warm_up_rows": "SELECT order_id, customer_id, status, amount * quantity AS total FROM source "
                    "WHERE status <> 'cancelled'",
    "warm_up_totals": "SELECT customer_id, COUNT(*) AS orders, SUM(amount) AS amount FROM source GROUP BY customer_id",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="warm_up", description=__doc__)
    parser.add_argument("--rows", type=int, default=500, help="orders in the generated upstream")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def body() -> int:
        from airflow_backfill.engine.phases.catch_up import run_catch_up
        from airflow_backfill.engine.phases.snapshot import run_snapshot
        from airflow_backfill.engine.spark_session import build_spark_session
        from airflow_backfill.job import BackfillJob
        from airflow_backfill.simulator import commit_epoch, create_orders_table

        with tempfile.TemporaryDirectory(prefix="airflow_backfill-warm-up-") as folder:
            source = f"{folder}/orders"
            create_orders_table(source, args.rows, seed=1)
            jobs = [
                BackfillJob(name=name, source=source, target=f"{folder}/{name}", query=query,
                            primary_key=("order_id",),
                            backfill_parallelism=2, parallelism=1, round_plan="incremental")
                for name, query in QUERIES.items()
            ]
            spark = build_spark_session("airflow_backfill:warm_up", 2)
            try:
                rng = random.Random(1)
                for job in jobs:
                    run_snapshot(spark, job, parallelism=2)
                for _ in range(2):
                    commit_epoch(source, rng, inserts=20, updates=20, deletes=5)
                    for job in jobs:
                        run_catch_up(spark, job, parallelism=2)
                for job in jobs:
                    log.info("warm-up MV %s: %d rows", job.name, spark.read.format("delta").load(job.target).count())
            finally:
                spark.stop()
        return 0

    return run_phase("warm-up", body)


if __name__ == "__main__":
    sys.exit(main())
