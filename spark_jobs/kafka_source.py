"""spark-submit entry point of a Kafka source job (the shared reader).

    spark-submit spark_jobs/kafka_source.py --job JOB.yaml [--max-rounds N] [--idle-timeout S]
        [--beside-backfill [--backfill-grace S]]

Appends the topic to the source table round after round; SIGTERM stops between commits.
One source job ingests a table at a time: a second one waits as a standby and takes over
when the first stops. `--beside-backfill` bounds it by the job's backfill: it stops once
every split is Finished, or once no backfill has been running for `--backfill-grace` seconds.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from dataclasses import dataclass

from airflow_backfill.kafka.liveness import BACKFILL_GRACE_S
from airflow_backfill.spark_jobs.common import log, run_phase
from airflow_backfill.spark_jobs.kafka_common import pipeline_arguments, resolve_pipeline
from airflow_backfill.stop_signals import request_stop_on


@dataclass(frozen=True)
class SourceArgs:
    job: argparse.Namespace
    max_rounds: int | None
    idle_timeout: float | None
    poll_interval: float
    beside_backfill: bool
    backfill_grace: float


def parse_args(argv: list[str] | None = None) -> SourceArgs:
    parser = argparse.ArgumentParser(prog="kafka_source", description=__doc__)
    pipeline_arguments(parser)
    parser.add_argument("--max-rounds", type=int, help="stop after N commits")
    parser.add_argument("--idle-timeout", type=float, help="stop after S seconds without new records")
    parser.add_argument("--poll-interval", type=float, default=1.0, help="seconds between polls when idle")
    parser.add_argument("--beside-backfill", action="store_true",
                        help="stop once the job's backfill has every split Finished (or is not running)")
    parser.add_argument("--backfill-grace", type=float, default=BACKFILL_GRACE_S,
                        help="with --beside-backfill: stop after S seconds without a running backfill "
                             f"(default {BACKFILL_GRACE_S:.0f})")
    args = parser.parse_args(argv)
    if args.max_rounds is not None and args.max_rounds < 1:
        parser.error("--max-rounds must be a positive integer")
    if args.idle_timeout is not None and args.idle_timeout <= 0:
        parser.error("--idle-timeout must be a positive number of seconds")
    if args.backfill_grace <= 0:
        parser.error("--backfill-grace must be a positive number of seconds")
    return SourceArgs(args, args.max_rounds, args.idle_timeout, args.poll_interval, args.beside_backfill,
                      args.backfill_grace)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop = threading.Event()
    request_stop_on(stop, [signal.SIGTERM])

    def body() -> int:
        from airflow_backfill.engine.spark_session import build_spark_session
        from airflow_backfill.kafka.source_job import BesideBackfill, run_source_job, sole_source_job

        pipeline = resolve_pipeline(args.job)
        job = pipeline.source_job
        bound = BesideBackfill(pipeline.backfill.target, args.backfill_grace) if args.beside_backfill else None
        with sole_source_job(job, lambda: stop.is_set() or (bound is not None and bound.reached() is not None)) as sole:
            if not sole:
                log.info("kafka_source: stopped while another source job was ingesting %s", job.table)
                return 0
            if bound is not None and (reason := bound.reached()) is not None:
                log.info("kafka_source: nothing to do: %s", reason)
                return 0
            spark = build_spark_session(f"airflow_backfill:{job.name}:kafka_source", job.parallelism)
            try:
                run_source_job(spark, job, poll_interval=args.poll_interval, max_rounds=args.max_rounds,
                               idle_timeout=args.idle_timeout, should_stop=stop.is_set, bound=bound)
            finally:
                spark.stop()
        return 0

    return run_phase("kafka_source", body)


if __name__ == "__main__":
    sys.exit(main())
