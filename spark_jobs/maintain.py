"""spark-submit entry point of MV maintenance (compaction, key clustering, deletion-vector purge).

    spark-submit spark_jobs/maintain.py --job JOB.yaml [--parallelism N] [--vacuum] [--max-file-size BYTES]
"""

from __future__ import annotations

import argparse
import sys

from airflow_backfill.spark_jobs.common import job_arguments, resolve_job, resolve_parallelism, run_phase


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="maintain", description=__doc__)
    job_arguments(parser)
    parser.add_argument("--vacuum", action="store_true", help="also VACUUM at the table's own retention")
    parser.add_argument("--max-file-size", type=int, default=None, metavar="BYTES",
                        help="largest file OPTIMIZE writes (default: Delta's 1 GiB)")
    args = parser.parse_args(argv)
    if args.max_file_size is not None and args.max_file_size < 1:
        parser.error("--max-file-size must be a positive number of bytes")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def body() -> int:
        from airflow_backfill.engine.maintenance import maintain_mv
        from airflow_backfill.engine.spark_session import build_spark_session

        job = resolve_job(args)
        parallelism = resolve_parallelism(args, job.backfill_parallelism)
        spark = build_spark_session(f"airflow_backfill:{job.name}:maintain", parallelism)
        try:
            maintain_mv(spark, job, vacuum=args.vacuum, max_file_size=args.max_file_size)
        finally:
            spark.stop()
        return 0

    return run_phase("maintain", body)


if __name__ == "__main__":
    sys.exit(main())
