"""spark-submit entry point of the shared forward: one application keeps every MV of a job
folder fresh (airflow_backfill/shared_forward/).

    spark-submit spark_jobs/shared_forward.py --folder JOBS_DIR [--parallelism N]
        [--workers N] [--poll-interval S] [--rescan-interval S] [--status-file PATH]
        [--max-seconds S] [--stop-grace S]
        [--backfill [--backfill-workers N] [--until-backfilled]]

With `--backfill` it also builds the folder's MVs that are not created yet (a folder
backfilled as one: each MV's snapshot and catch-up, `--backfill-workers` at once, an MV
over an MV after its source), then keeps them fresh with the others; a job file added
later is built the same way. `--until-backfilled` exits 0 once every Delta MV of the
folder is built (`airflow-backfill backfill --jobs-in`), leaving the Kafka pipelines out.

Runs until stopped: SIGTERM (or SIGINT) lets the rounds in flight commit and exits 0;
with `--stop-grace S`, rounds that have not finished S seconds after the signal are
abandoned (every MV stays at its last committed watermark).
"""

from __future__ import annotations

import argparse
import sys
import threading
from dataclasses import dataclass

from airflow_backfill.job import validate_parallelism
from airflow_backfill.shared_forward import DEFAULT_BACKFILL_WORKERS, DEFAULT_WORKERS
from airflow_backfill.spark_jobs.common import run_phase
from airflow_backfill.spark_jobs.forward import install_stop_handlers

EXIT_NOT_BACKFILLED = 3
"""`--until-backfilled` stopped (by --max-seconds or a signal) before every MV was built."""


@dataclass(frozen=True)
class SharedForwardArgs:
    folder: str
    parallelism: int
    workers: int
    poll_interval: float
    rescan_interval: float
    status_file: str | None
    max_seconds: float | None
    stop_grace: float | None
    backfill: bool = False
    backfill_workers: int = DEFAULT_BACKFILL_WORKERS
    until_backfilled: bool = False


def parse_args(argv: list[str] | None = None) -> SharedForwardArgs:
    parser = argparse.ArgumentParser(prog="shared_forward", description=__doc__)
    parser.add_argument("--folder", required=True, help="the folder of job files")
    parser.add_argument("--parallelism", type=int, default=2, help="Spark parallelism of the application")
    parser.add_argument("--workers", type=int, default=DEFAULT_WORKERS,
                        help=f"rounds applied at once (default {DEFAULT_WORKERS})")
    parser.add_argument("--poll-interval", type=float, default=0.5, help="seconds between an idle MV's polls")
    parser.add_argument("--rescan-interval", type=float, default=15.0, help="seconds between reads of the folder")
    parser.add_argument("--status-file", help="write the members' status (JSON) to this file every second")
    parser.add_argument("--max-seconds", type=float, help="stop after S seconds (tests, benchmarks)")
    parser.add_argument("--stop-grace", type=float, help="once stopped, abandon rounds still running after S s")
    parser.add_argument("--backfill", action="store_true", help="also build the MVs not created yet (snapshot, catch-up)")
    parser.add_argument("--backfill-workers", type=int, default=DEFAULT_BACKFILL_WORKERS,
                        help=f"MVs built at once with --backfill (default {DEFAULT_BACKFILL_WORKERS})")
    parser.add_argument("--until-backfilled", action="store_true",
                        help="exit once every Delta MV of the folder is built (implies --backfill; no Kafka pipelines)")
    args = parser.parse_args(argv)
    for name in ("poll_interval", "rescan_interval", "max_seconds", "stop_grace"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            parser.error(f"--{name.replace('_', '-')} must be a positive number of seconds")
    if not 1 <= args.workers <= 64:
        parser.error("--workers must be between 1 and 64")
    if not 1 <= args.backfill_workers <= 64:
        parser.error(f"--backfill-workers must be between 1 and 64, got {args.backfill_workers}; it is how many "
                     "MVs are built at once")
    validate_parallelism("--parallelism", args.parallelism)
    return SharedForwardArgs(args.folder, args.parallelism, args.workers, args.poll_interval,
                             args.rescan_interval, args.status_file, args.max_seconds, args.stop_grace,
                             args.backfill or args.until_backfilled, args.backfill_workers, args.until_backfilled)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop = threading.Event()
    install_stop_handlers(stop, args.stop_grace)

    def body() -> int:
        from airflow_backfill.engine.spark_session import build_spark_session
        from airflow_backfill.shared_forward.folder import folder_members
        from airflow_backfill.shared_forward.loop import BACKFILLED, MemberSet, SharedForward

        def members() -> MemberSet:
            return folder_members(args.folder, backfill=args.backfill, kafka=not args.until_backfilled)

        members()  # an unreadable folder fails here, before Spark starts
        spark = build_spark_session("airflow_backfill:shared_forward", args.parallelism)
        try:
            result = SharedForward(
                spark, members, workers=args.workers, backfill_workers=args.backfill_workers,
                poll_interval=args.poll_interval, rescan_interval=args.rescan_interval,
                status_path=args.status_file,
            ).run(stop, max_seconds=args.max_seconds, until_backfilled=args.until_backfilled)
        finally:
            spark.stop()
        if args.until_backfilled and result.stopped_by != BACKFILLED:
            return EXIT_NOT_BACKFILLED
        return 0

    return run_phase("shared forward", body)


if __name__ == "__main__":
    sys.exit(main())
