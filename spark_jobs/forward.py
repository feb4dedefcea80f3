"""spark-submit entry point of the forward phase.

    spark-submit spark_jobs/forward.py --job JOB.yaml [--parallelism N]
        [--max-epochs N] [--idle-timeout SECONDS] [--stop-grace SECONDS]

Runs until stopped: SIGTERM (or SIGINT) finishes the commit in progress and exits 0.
With `--stop-grace S`, a commit that has not finished S seconds after the signal is
abandoned: the process exits at once, and the MV stays at its last committed watermark
(a Delta commit is atomic). Airflow kills a stopped task's process group 5 s after
SIGTERM, so the forward task passes a grace below that.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from dataclasses import dataclass

from airflow_backfill.spark_jobs.common import job_arguments, log, resolve_job, resolve_parallelism, run_phase
from airflow_backfill.stop_signals import request_stop_on


@dataclass(frozen=True)
class ForwardArgs:
    job: argparse.Namespace
    max_epochs: int | None
    idle_timeout: float | None
    stop_grace: float | None = None


def parse_args(argv: list[str] | None = None) -> ForwardArgs:
    parser = argparse.ArgumentParser(prog="forward", description=__doc__)
    job_arguments(parser)
    parser.add_argument("--max-epochs", type=int, help="stop after the watermark moved N epochs")
    parser.add_argument("--idle-timeout", type=float, help="stop after S seconds without new epochs")
    parser.add_argument("--stop-grace", type=float,
                        help="once stopped, abandon a commit that has not finished after S seconds")
    args = parser.parse_args(argv)
    if args.max_epochs is not None and args.max_epochs < 1:
        parser.error("--max-epochs must be a positive integer")
    if args.idle_timeout is not None and args.idle_timeout <= 0:
        parser.error("--idle-timeout must be a positive number of seconds")
    if args.stop_grace is not None and args.stop_grace <= 0:
        parser.error("--stop-grace must be a positive number of seconds")
    return ForwardArgs(job=args, max_epochs=args.max_epochs, idle_timeout=args.idle_timeout,
                       stop_grace=args.stop_grace)


ABANDONED_EXIT_CODE = 3
"""Exit status when the stop grace ran out with a commit in flight (nothing was lost)."""


def abandon_after(grace: float) -> threading.Timer:
    """A timer that ends the process once `grace` seconds passed since the stop request."""

    def abandon() -> None:
        log.warning("forward: the commit in flight did not finish within the %.1f s stop grace; "
                    "abandoning it (the MV stays at its last committed watermark)", grace)
        logging.shutdown()
        os._exit(ABANDONED_EXIT_CODE)

    timer = threading.Timer(grace, abandon)
    timer.daemon = True
    return timer


def install_stop_handlers(stop: threading.Event, grace: float | None = None) -> None:
    """SIGTERM/SIGINT request a stop that takes effect between commits (within `grace` s)."""

    def announce(signum: int) -> None:
        log.info("forward: received signal %s, stopping after the current commit", signum)
        if grace is not None and not stop.is_set():
            abandon_after(grace).start()

    request_stop_on(stop, on_request=announce)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop = threading.Event()
    install_stop_handlers(stop, args.stop_grace)

    def body() -> int:
        from airflow_backfill.engine.phases.forward import ForwardBounds, run_forward
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
