"""The plain Spark recompute as its own spark-submit: what a user would run instead of catching up.

    spark-submit --master local[2] bench/plain_recompute.py --source URI --version V --query SQL --target URI
    spark-submit --master local[2] bench/plain_recompute.py --table NAME=URI@V [--table ...] --query SQL --target URI

A session with Spark's and Delta's defaults (no engine settings), the upstream read as of
the version (or each table of a join, by the name the query gives it, as of its own), the
query, an overwrite of a Delta table. `--timing-file` receives the seconds of the read,
query and write alone (the process's start excluded).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench.workload import plain_recompute_over  # noqa: E402


def table_argument(value: str) -> tuple[str, tuple[str, int]]:
    """`NAME=URI@VERSION` -> (name, (uri, version))."""
    name, _, rest = value.partition("=")
    uri, _, version = rest.rpartition("@")
    if not name or not uri or not version.isdigit():
        raise argparse.ArgumentTypeError(f"expected NAME=URI@VERSION, got {value!r}")
    return name, (uri, int(version))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="plain_recompute", description=__doc__.split("\n\n")[0])
    parser.add_argument("--source")
    parser.add_argument("--version", type=int)
    parser.add_argument("--table", type=table_argument, action="append", default=[],
                        help="NAME=URI@VERSION, for a query over several tables (repeat)")
    parser.add_argument("--query", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--timing-file", default=None)
    args = parser.parse_args(argv)
    tables = dict(args.table)
    if args.source is not None:
        if args.version is None:
            parser.error("--source needs --version")
        tables["source"] = (args.source, args.version)
    if not tables:
        parser.error("give --source and --version, or --table")
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName("plain-recompute").getOrCreate()
    try:
        started = time.monotonic()
        plain_recompute_over(spark, tables, args.query, args.target)
        seconds = time.monotonic() - started
    finally:
        spark.stop()
    if args.timing_file:
        with open(args.timing_file, "w") as handle:
            json.dump({"seconds": round(seconds, 3)}, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
