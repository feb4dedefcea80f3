"""spark-submit entry point of a Kafka source backfill.

    spark-submit spark_jobs/kafka_backfill.py --job JOB.yaml [--timeout S] [--poll-interval S]

Runs rounds until every split is Finished. A killed run resumes from the split states of
the MV's last commit; finished splits are never read from Kafka again.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from dataclasses import dataclass

from airflow_backfill.spark_jobs.common import log, run_phase
from airflow_backfill.spark_jobs.kafka_common import pipeline_arguments, resolve_pipeline
from airflow_backfill.stop_signals import request_stop_on


@dataclass(frozen=True)
class BackfillArgs:
    job: argparse.Namespace
    timeout: float | None
    poll_interval: float


def parse_args(argv: list[str] | None = None) -> BackfillArgs:
    parser = argparse.ArgumentParser(prog="kafka_backfill", description=__doc__)
    pipeline_arguments(parser)
    parser.add_argument("--timeout", type=float, help="fail when not finished after S seconds")
    parser.add_argument("--poll-interval", type=float, default=1.0, help="seconds between rounds that wait")
    args = parser.parse_args(argv)
    if args.timeout is not None and args.timeout <= 0:
        parser.error("--timeout must be a positive number of seconds")
    return BackfillArgs(args, args.timeout, args.poll_interval)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop = threading.Event()
    request_stop_on(stop, [signal.SIGTERM])

    def body() -> int:
        from airflow_backfill.engine.spark_session import build_spark_session
        from airflow_backfill.engine.writer_lock import writer_lock
        from airflow_backfill.kafka.liveness import BACKFILL, beating
        from airflow_backfill.kafka.source_backfill import PHASE, run_backfill

        job = resolve_pipeline(args.job).backfill
        with writer_lock(job.target, job.name, PHASE), beating(job.target, BACKFILL):
            spark = build_spark_session(f"airflow_backfill:{job.name}:kafka_backfill", job.backfill_parallelism)
            try:
                result = run_backfill(spark, job, poll_interval=args.poll_interval, timeout=args.timeout,
                                      should_stop=stop.is_set)
            finally:
                spark.stop()
        log.info("kafka_backfill: round %s, finished=%s", result.round, result.finished)
        return 0

    return run_phase("kafka_backfill", body)


if __name__ == "__main__":
    sys.exit(main())
