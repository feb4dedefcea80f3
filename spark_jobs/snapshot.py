"""spark-submit entry point of the snapshot phase.

    spark-submit spark_jobs/snapshot.py --job JOB.yaml [--epoch N] [--parallelism N]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from airflow_backfill.engine.phases.snapshot_chunks import DEFAULT_CHUNK_BYTES
from airflow_backfill.spark_jobs.common import job_arguments, resolve_job, resolve_parallelism, run_phase


@dataclass(frozen=True)
class SnapshotArgs:
    job: argparse.Namespace
    epoch: int | None
    chunk_bytes: int


def parse_args(argv: list[str] | None = None) -> SnapshotArgs:
    parser = argparse.ArgumentParser(prog="snapshot", description=__doc__)
    job_arguments(parser)
    parser.add_argument("--epoch", type=int, help="upstream version to pin (default: latest)")
    parser.add_argument(
        "--chunk-bytes", type=int, default=DEFAULT_CHUNK_BYTES,
        help="upstream bytes per snapshot chunk, the unit of progress and resumption",
    )
    args = parser.parse_args(argv)
    if args.chunk_bytes < 1:
        parser.error("--chunk-bytes must be a positive integer")
    return SnapshotArgs(job=args, epoch=args.epoch, chunk_bytes=args.chunk_bytes)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def body() -> int:
        from airflow_backfill.engine.delta.log import check_upstream
        from airflow_backfill.engine.delta.retention import retention_warnings
        from airflow_backfill.engine.phases.snapshot import run_snapshot
        from airflow_backfill.engine.spark_session import build_spark_session

        job = resolve_job(args.job)
        parallelism = resolve_parallelism(args.job, job.backfill_parallelism)
        check_upstream(job.source)
        retention_warnings(job.source, parallelism)
        spark = build_spark_session(f"airflow_backfill:{job.name}:snapshot", parallelism)
        try:
            run_snapshot(spark, job, epoch=args.epoch, parallelism=parallelism, chunk_bytes=args.chunk_bytes)
        finally:
            spark.stop()
        return 0

    return run_phase("snapshot", body)


if __name__ == "__main__":
    sys.exit(main())
