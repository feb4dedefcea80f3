"""spark-submit entry point of the log-store catch-up phase.

    spark-submit spark_jobs/catch_up.py --job JOB.yaml [--parallelism N]
"""

from __future__ import annotations

import argparse
import sys

from airflow_backfill.spark_jobs.common import job_arguments, resolve_job, resolve_parallelism, run_phase


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="catch_up", description=__doc__)
    job_arguments(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def body() -> int:
        from airflow_backfill.engine.delta.retention import margin_warnings
        from airflow_backfill.engine.phases.catch_up import run_catch_up
        from airflow_backfill.engine.phases.rounds import applied_versions
        from airflow_backfill.engine.spark_session import build_spark_session

        job = resolve_job(args)
        parallelism = resolve_parallelism(args, job.backfill_parallelism)
        for uri, version in applied_versions(job):  # checks the upstreams and the MV first
            margin_warnings(uri, version)
        spark = build_spark_session(f"airflow_backfill:{job.name}:catch_up", parallelism)
        try:
            run_catch_up(spark, job, parallelism=parallelism)
        finally:
            spark.stop()
        return 0

    return run_phase("catch-up", body)


if __name__ == "__main__":
    sys.exit(main())
