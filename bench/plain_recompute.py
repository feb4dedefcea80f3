"""The plain Spark recompute as its own spark-submit: what a user would run instead of catching up.

    spark-submit --master local[2] bench/plain_recompute.py --source URI --version V --query SQL --target URI

A session with Spark's and Delta's defaults (no engine settings), the upstream read as of
the version, the query, an overwrite of a Delta table.
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench.workload import plain_recompute  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="plain_recompute", description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", required=True)
    parser.add_argument("--version", type=int, required=True)
    parser.add_argument("--query", required=True)
    parser.add_argument("--target", required=True)
    args = parser.parse_args(argv)
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName("plain-recompute").getOrCreate()
    try:
        plain_recompute(spark, args.source, args.version, args.query, args.target)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
