"""Spark reads of Parquet files the Delta log names, without Spark's listing job.

Why: given more paths than `spark.sql.sources.parallelPartitionDiscovery.threshold` (32),
Spark looks each one up in a job of its own before it can plan the read. A snapshot of
TPC-H `lineitem` after 320 refreshes at SF 1 names 163 files: that job took 0.52 s of the
snapshot, where the driver looks up 491 local files in 0.1 - 0.2 s (docs/benchmarks.md). The files are
known to exist (the log lists them), so on a local file system the driver looks them up
itself. On an object store each lookup is a request, which Spark's job spreads over the
executors, so the threshold is left as it is there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from airflow_backfill.storage.uri import is_object_store

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

LISTING_THRESHOLD = "spark.sql.sources.parallelPartitionDiscovery.threshold"


def read_parquet_files(spark: SparkSession, schema: StructType, paths: Sequence[str]) -> DataFrame:
    """The rows of the Parquet files at `paths`, read with `schema` (no schema inference)."""
    reader = spark.read.schema(schema)
    listed_by_driver = not any(is_object_store(path) for path in paths)
    previous = spark.conf.get(LISTING_THRESHOLD, None)
    if not listed_by_driver or previous is not None and int(previous) >= len(paths):
        return reader.parquet(*paths)
    spark.conf.set(LISTING_THRESHOLD, str(len(paths)))  # read when the read is planned, just below
    try:
        return reader.parquet(*paths)
    finally:
        if previous is None:
            spark.conf.unset(LISTING_THRESHOLD)
        else:
            spark.conf.set(LISTING_THRESHOLD, previous)
