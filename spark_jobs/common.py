"""Argument parsing and process set-up shared by the spark-submit entry points."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable

from airflow_backfill.exceptions import BackfillConfigError, BackfillError
from airflow_backfill.job import BackfillJob, load_job, validate_parallelism

log = logging.getLogger("airflow_backfill")


def job_arguments(parser: argparse.ArgumentParser) -> None:
    """--job FILE | --job-json JSON (the operators write the job to a file, see
    airflow_backfill/operators/job_file.py)."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--job", help="path of a job file (YAML or JSON)")
    source.add_argument("--job-json", help="the job as a JSON object")
    parser.add_argument("--parallelism", type=int, help="Spark parallelism of this phase")


def resolve_job(args: argparse.Namespace) -> BackfillJob:
    if args.job:
        return load_job(args.job)
    try:
        data = json.loads(args.job_json)
    except json.JSONDecodeError as error:
        raise BackfillConfigError(f"--job-json is not valid JSON: {error}") from None
    return BackfillJob.from_mapping(data, origin="--job-json")


def resolve_parallelism(args: argparse.Namespace, default: int) -> int:
    if args.parallelism is None:
        return default
    return validate_parallelism("--parallelism", args.parallelism)


def configure_logging() -> None:
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)


def run_phase(phase: str, body: Callable[[], int]) -> int:
    """Run a phase body; a BackfillError becomes one clear log line and exit code 2."""
    configure_logging()
    try:
        return body()
    except BackfillError as error:
        log.error("%s failed: %s", phase, error)
        return 2
