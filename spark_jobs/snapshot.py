"""spark-submit entry point of the snapshot phase.

    spark-submit spark_jobs/snapshot.py --job JOB.yaml [--epoch N | --epochs VERSIONS] [--parallelism N]

A join's `--epochs` names every upstream's version, as `orders=5,lineitem=7` (what the
snapshot task passes: its logged command pastes into a shell as it is) or as a JSON
object, `'{"orders": 5, "lineitem": 7}'`.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

from airflow_backfill.engine.snapshot_chunks.plan import DEFAULT_CHUNK_BYTES, DEFAULT_JOIN_CHUNK_BYTES
from airflow_backfill.spark_jobs.common import job_arguments, resolve_job, resolve_parallelism, run_phase


@dataclass(frozen=True)
class SnapshotArgs:
    job: argparse.Namespace
    epoch: int | None
    chunk_bytes: int | None
    epochs: dict[str, int] | None = None


def parse_args(argv: list[str] | None = None) -> SnapshotArgs:
    parser = argparse.ArgumentParser(prog="snapshot", description=__doc__)
    job_arguments(parser)
    pinned = parser.add_mutually_exclusive_group()
    pinned.add_argument("--epoch", type=int, help="upstream version to pin (default: latest)")
    pinned.add_argument("--epochs", help='a join\'s upstream versions to pin: orders=5,lineitem=7 or the JSON '
                        '{"orders": 5, "lineitem": 7}')
    parser.add_argument(
        "--chunk-bytes", type=int, default=None,
        help=f"upstream bytes per snapshot chunk, the unit of progress and resumption (default "
             f"{DEFAULT_CHUNK_BYTES >> 20} MiB; {DEFAULT_JOIN_CHUNK_BYTES >> 20} MiB for a join)",
    )
    args = parser.parse_args(argv)
    if args.chunk_bytes is not None and args.chunk_bytes < 1:
        parser.error("--chunk-bytes must be a positive integer")
    return SnapshotArgs(job=args, epoch=args.epoch, chunk_bytes=args.chunk_bytes,
                        epochs=None if args.epochs is None else _versions(parser, args.epochs))


def _versions(parser: argparse.ArgumentParser, text: str) -> dict[str, int]:
    value: object
    if text.lstrip().startswith("{"):
        try:
            value = json.loads(text)
        except ValueError:
            value = None
    else:
        pairs = [pair.partition("=") for pair in text.split(",")]
        value = {name.strip(): int(version) if version.strip().isdigit() else None
                 for name, equals, version in pairs if equals} if all(equals for _, equals, _ in pairs) else None
    if not isinstance(value, dict) or not value or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value.values()):
        parser.error(f"--epochs must name each upstream's version, e.g. orders=5,lineitem=7 or "
                     f"{{\"orders\": 5, \"lineitem\": 7}}, got {text!r}")
    return {str(name): int(version) for name, version in value.items()}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def body() -> int:
        from airflow_backfill.engine.delta.log import check_upstream
        from airflow_backfill.engine.delta.retention import retention_warnings
        from airflow_backfill.engine.phases.snapshot import run_snapshot
        from airflow_backfill.engine.spark_session import build_spark_session

        job = resolve_job(args.job)
        parallelism = resolve_parallelism(args.job, job.backfill_parallelism)
        for upstream in job.upstreams:  # refused before the JVM starts (a join's planner resolves its keys)
            check_upstream(upstream.table, key=() if job.is_join else upstream.primary_key)
            retention_warnings(upstream.table, parallelism)
        spark = build_spark_session(f"airflow_backfill:{job.name}:snapshot", parallelism)
        try:
            run_snapshot(spark, job, epoch=args.epoch, parallelism=parallelism, chunk_bytes=args.chunk_bytes,
                         epochs=args.epochs)
        finally:
            spark.stop()
        return 0

    return run_phase("snapshot", body)


if __name__ == "__main__":
    sys.exit(main())
