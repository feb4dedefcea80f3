"""spark-submit entry point of the forward phase.

    spark-submit spark_jobs/forward.py --job JOB.yaml [--parallelism N]
        [--max-epochs N] [--idle-timeout SECONDS]

Runs until stopped: SIGTERM (or SIGINT) finishes the commit in progress and exits 0.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from dataclasses import dataclass

from airflow_backfill.spark_jobs.common import job_arguments, log, resolve_job, resolve_parallelism, run_phase


@dataclass(frozen=True)
class ForwardArgs:
    job: argparse.Namespace
    max_epochs: int | None
    idle_timeout: float | None


def parse_args(argv: list[str] | None = None) -> ForwardArgs:
    parser = argparse.ArgumentParser(prog="forward", description=__doc__)
    job_arguments(parser)
    parser.add_argument("--max-epochs", type=int, help="stop after the watermark moved N epochs")
    parser.add_argument("--idle-timeout", type=float, help="stop after S seconds without new epochs")
    args = parser.parse_args(argv)
    if args.max_epochs is not None and args.max_epochs < 1:
        parser.error("--max-epochs must be a positive integer")
    if args.idle_timeout is not None and args.idle_timeout <= 0:
        parser.error("--idle-timeout must be a positive number of seconds")
    return ForwardArgs(job=args, max_epochs=args.max_epochs, idle_timeout=args.idle_timeout)


def install_stop_handlers(stop: threading.Event) -> None:
    """SIGTERM/SIGINT request a stop that takes effect between commits."""

    def request_stop(signum: int, _frame: object) -> None:
        log.info("forward: received signal %s, stopping after the current commit", signum)
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop = threading.Event()
    install_stop_handlers(stop)

    def body() -> int:
        from airflow_backfill.engine.forward import ForwardBounds, run_forward
        from airflow_backfill.engine.spark_session import build_spark_session

        job = resolve_job(args.job)
        parallelism = resolve_parallelism(args.job, job.parallelism)
        spark = build_spark_session(f"airflow_backfill:{job.name}:forward", parallelism)
        try:
            run_forward(
                spark, job, parallelism=parallelism, stop=stop,
                bounds=ForwardBounds(max_epochs=args.max_epochs, idle_timeout=args.idle_timeout),
            )
        finally:
            spark.stop()
        return 0

    return run_phase("forward", body)


if __name__ == "__main__":
    sys.exit(main())
