"""spark-submit entry point of the optional verification task.

    spark-submit spark_jobs/verify.py --job JOB.yaml [--parallelism N] [--key-ranges N] [--show N]

Recomputes the query on the upstream as of the MV's watermark and compares it with the
MV (see airflow_backfill/engine/verify.py). Exit status 0 when equal, 1 when not (the
first differing keys are logged), 2 on a configuration error.
"""

from __future__ import annotations

import argparse
import sys

from airflow_backfill.spark_jobs.common import job_arguments, log, resolve_job, resolve_parallelism, run_phase

EXIT_DIFFERENT = 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="verify", description=__doc__)
    job_arguments(parser)
    parser.add_argument("--key-ranges", type=int, default=64, help="hash ranges of the MV key (default 64)")
    parser.add_argument("--show", type=int, default=5, help="differing keys to log (default 5)")
    args = parser.parse_args(argv)
    if args.key_ranges < 1 or args.show < 1:
        parser.error("--key-ranges and --show must be positive integers")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def body() -> int:
        from airflow_backfill.engine.spark_session import build_spark_session
        from airflow_backfill.engine.verify import mv_version_and_watermark, verify_mv

        job = resolve_job(args)
        parallelism = resolve_parallelism(args, job.parallelism)
        mv_version_and_watermark(job)  # a missing MV fails before Spark starts
        spark = build_spark_session(f"airflow_backfill:{job.name}:verify", parallelism)
        try:
            report = verify_mv(spark, job, key_ranges=args.key_ranges, show=args.show)
        finally:
            spark.stop()
        for line in report.lines():
            (log.info if report.equal else log.error)("verify: %s", line)
        return 0 if report.equal else EXIT_DIFFERENT

    return run_phase("verify", body)


if __name__ == "__main__":
    sys.exit(main())
