"""Commits made by Spark with delta-spark, as a Databricks user's job makes them.

The table has deletion vectors on: DELETE, UPDATE and MERGE mark rows deleted in the
files they touch instead of rewriting them, and the Change Data Feed is derived from
those vectors and the change files. Appends and re-inserts are DataFrame appends,
updates `UPDATE ... SET ... WHERE`, deletes `DELETE FROM ... WHERE`, upserts a MERGE
with `whenMatchedUpdateAll` / `whenNotMatchedInsertAll`.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from bench.commit_mix import APPEND, DELETE, REINSERT, UPDATE, UPSERT, CommitPlan
from bench.delta_rs_writer import ROWS_PER_FILE, UPSTREAM_PROPERTIES
from bench.local_spark import delta_session

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from bench.user_tables import UserTable

SPARK_PROPERTIES = {**UPSTREAM_PROPERTIES, "delta.enableDeletionVectors": "true"}
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"


def writer_session(app_name: str) -> SparkSession:
    """The writer's own application: one core, its commits at most 500 rows."""
    return delta_session(app_name, cores=1)


def create(spark: SparkSession, uri: str, rows: pa.Table, metadata: dict[str, str]) -> None:
    """The initial load as version 0, in files of about a million rows: the Arrow rows
    go through a Parquet file (a local relation of millions of rows would cross py4j)."""
    staging = tempfile.mkdtemp(prefix="bench-spark-load-")
    try:
        pq.write_table(rows, f"{staging}/rows.parquet")
        frame = spark.read.parquet(staging).repartition(max(1, math.ceil(rows.num_rows / ROWS_PER_FILE)))
        writer = frame.write.format("delta")
        for key, value in SPARK_PROPERTIES.items():
            writer = writer.option(key, value)
        with user_metadata(spark, metadata):
            writer.save(uri)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextmanager
def user_metadata(spark: SparkSession, metadata: dict[str, str]) -> Iterator[None]:
    """The commits of the block carry `metadata` as Delta's `userMetadata` (JSON)."""
    spark.conf.set(USER_METADATA, json.dumps(metadata, sort_keys=True))
    try:
        yield
    finally:
        spark.conf.unset(USER_METADATA)


def commit(spark: SparkSession, table: UserTable, uri: str, plan: CommitPlan, rows: pa.Table,
           metadata: dict[str, str]) -> None:
    """One commit of `plan` (see `delta_rs_writer.commit`). Raises Delta's
    `DeltaConcurrentModificationException` on a conflict."""
    from delta.tables import DeltaTable

    path = f"delta.`{uri}`"
    with user_metadata(spark, metadata):
        if plan.kind in (APPEND, REINSERT):
            _frame(spark, rows).write.format("delta").mode("append").save(uri)
        elif plan.kind == UPDATE:
            assignments = ", ".join(f"{column} = {value}" for column, value in table.updates.items())
            spark.sql(f"UPDATE {path} SET {assignments} WHERE {table.predicate(plan.updated)}")
        elif plan.kind == DELETE:
            spark.sql(f"DELETE FROM {path} WHERE {table.predicate(plan.deleted)}")
        elif plan.kind == UPSERT:
            matched = " AND ".join(f"t.{column} = s.{column}" for column in table.key)
            (DeltaTable.forPath(spark, uri).alias("t").merge(_frame(spark, rows).alias("s"), matched)
             .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())
        else:
            raise ValueError(f"unknown commit kind {plan.kind!r}")


def _frame(spark: SparkSession, rows: pa.Table) -> DataFrame:
    return spark.createDataFrame(rows)
