"""`airflow-backfill backfill --jobs-in DIR`: build a folder's MVs in one Spark application
from the command line, and wait for them (bounded).

The same application as the shared forward's task with `--backfill` (`shared_forward/`):
each MV not created yet is snapshotted and caught up, an MV over an MV after its source,
a join after all its upstreams, `--backfill-workers` at once, each committing on its own.
MVs already built are kept fresh meanwhile and left as they are. The command returns once
every Delta MV of the folder is built (exit 0), or after `--timeout` seconds (exit 1,
naming the MVs left and their last errors); a rerun resumes what was committed. Progress
is logged every `--progress-interval` seconds (`folder backfill: 12 of 50 MVs built;
building: ...`). Kafka pipelines are left out: their backfill is `source_backfill`.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from typing import Any

from airflow_backfill.exceptions import BackfillConfigError

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_NOT_BUILT = 1
DEFAULT_TIMEOUT = 3600.0


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value <= 7 * 86400:
        raise argparse.ArgumentTypeError(f"expected more than 0 and at most 604800 seconds, got {value}")
    return value


def _workers(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number from 1 to 64, got {text!r}") from None
    if not 1 <= value <= 64:
        raise argparse.ArgumentTypeError(f"expected a whole number from 1 to 64, got {value}")
    return value


def add_backfill(subparsers: Any) -> None:
    from airflow_backfill.shared_forward import DEFAULT_BACKFILL_WORKERS

    parser = subparsers.add_parser(
        "backfill",
        help="build every MV of a job folder in one Spark application",
        description="Snapshot and catch up every MV of the folder that is not created yet, in one Spark "
        "application (an MV over an MV after its source, a join after its upstreams), and wait until all "
        "are built. A rerun resumes what was committed.",
    )
    parser.add_argument("--jobs-in", required=True, metavar="DIR", help="the folder of job files")
    parser.add_argument("--backfill-workers", type=_workers, default=DEFAULT_BACKFILL_WORKERS, metavar="N",
                        help=f"MVs built at once (default {DEFAULT_BACKFILL_WORKERS})")
    parser.add_argument("--parallelism", type=_workers, default=2, metavar="N",
                        help="Spark parallelism of the application, local[N] (default 2)")
    parser.add_argument("--timeout", type=_seconds, default=DEFAULT_TIMEOUT, metavar="S",
                        help=f"give up after S seconds (default {DEFAULT_TIMEOUT:.0f}); what was committed stays")
    parser.add_argument("--progress-interval", type=_seconds, default=10.0, metavar="S",
                        help="seconds between two progress lines (default 10)")
    parser.set_defaults(run=run_backfill)


def run_backfill(args: argparse.Namespace) -> int:
    from airflow_backfill.engine.spark_session import build_spark_session
    from airflow_backfill.shared_forward.folder import folder_members
    from airflow_backfill.shared_forward.loop import BACKFILLED, SharedForward
    from airflow_backfill.stop_signals import request_stop_on

    folder = os.path.abspath(os.path.expanduser(args.jobs_in))
    found = folder_members(folder, backfill=True, kafka=False)  # a missing folder fails here, before Spark
    for path, message in sorted(found.errors.items()):
        log.error("job file %s is left out: %s", path, message)
    if not found.members:
        raise BackfillConfigError(f"job folder {folder} has no Delta job to backfill; add job files (*.yaml) "
                                  "or fix those that failed to load (above).")
    stop = threading.Event()
    spark = build_spark_session("airflow_backfill:folder_backfill", args.parallelism)
    try:
        loop = SharedForward(spark, lambda: folder_members(folder, backfill=True, kafka=False),
                             backfill_workers=args.backfill_workers, progress_interval=args.progress_interval)
        replaced = request_stop_on(stop)  # Ctrl-C: the backfills in flight commit their chunk or round
        try:
            result = loop.run(stop, max_seconds=args.timeout, until_backfilled=True)
        finally:
            for signum, handler in replaced.items():
                signal.signal(signum, handler)
    finally:
        spark.stop()
    if result.stopped_by == BACKFILLED:
        built = sum(status.backfill_seconds is not None for status in loop.members.values())
        print(f"every MV of {folder} is built ({built} built by this run, {len(loop.members) - built} already were)")
        return EXIT_OK
    left = [f"{name} ({status.last_error or status.waiting or 'building'})"
            for name, status in sorted(loop.members.items()) if status.backfill]
    print(f"stopped ({result.stopped_by}) before every MV was built; left: {', '.join(left)}. "
          "Run the command again: it resumes what was committed.")
    return EXIT_NOT_BUILT
