"""spark-submit entry point of a Kafka source job (the shared reader).

    spark-submit spark_jobs/kafka_source.py --job JOB.yaml [--max-rounds N] [--idle-timeout S]

Appends the topic to the source table round after round; SIGTERM stops between commits.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from dataclasses import dataclass

from airflow_backfill.spark_jobs.common import run_phase
from airflow_backfill.spark_jobs.kafka_common import pipeline_arguments, resolve_pipeline


@dataclass(frozen=True)
class SourceArgs:
    job: argparse.Namespace
    max_rounds: int | None
    idle_timeout: float | None
    poll_interval: float


def parse_args(argv: list[str] | None = None) -> SourceArgs:
    parser = argparse.ArgumentParser(prog="kafka_source", description=__doc__)
    pipeline_arguments(parser)
    parser.add_argument("--max-rounds", type=int, help="stop after N commits")
    parser.add_argument("--idle-timeout", type=float, help="stop after S seconds without new records")
    parser.add_argument("--poll-interval", type=float, default=1.0, help="seconds between polls when idle")
    args = parser.parse_args(argv)
    if args.max_rounds is not None and args.max_rounds < 1:
        parser.error("--max-rounds must be a positive integer")
    if args.idle_timeout is not None and args.idle_timeout <= 0:
        parser.error("--idle-timeout must be a positive number of seconds")
    return SourceArgs(args, args.max_rounds, args.idle_timeout, args.poll_interval)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def body() -> int:
        from airflow_backfill.engine.spark_session import build_spark_session
        from airflow_backfill.kafka.source_job import run_source_job

        job = resolve_pipeline(args.job).source_job
        spark = build_spark_session(f"airflow_backfill:{job.name}:kafka_source", job.parallelism)
        try:
            run_source_job(spark, job, poll_interval=args.poll_interval, max_rounds=args.max_rounds,
                           idle_timeout=args.idle_timeout, should_stop=stop.is_set)
        finally:
            spark.stop()
        return 0

    return run_phase("kafka_source", body)


if __name__ == "__main__":
    sys.exit(main())
