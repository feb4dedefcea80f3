"""The hidden per-group state of an aggregate MV: a Delta table next to the MV.

Why a separate table (`<target>/_airflow_backfill/agg_state`) rather than hidden
columns in the MV: the MV then holds exactly the query's columns and rows, so readers,
the oracle and a downstream MV (MV-on-MV) see nothing of the bookkeeping; and groups
that fail HAVING keep their state without being visible. The cost is two commits per
round instead of one, made in a fixed order:

1. the state table, with app transaction `airflow_backfill/<job>` = the new epoch;
2. the MV, with the same app transaction.

So the state's watermark is never behind the MV's. A crash between the two leaves the
state one round ahead; the next round sees it (`state watermark > MV watermark`) and
first brings the MV up to the state, recomputing the visible rows from it. Delta
ignores folders starting with `_`, so the MV's own log never lists the state's files.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import replace
from typing import TYPE_CHECKING

import pyarrow as pa
from deltalake import DeltaTable

from airflow_backfill.engine.delta_log import arrow_schema, table_exists
from airflow_backfill.engine.job_state import state_dir
from airflow_backfill.engine.mv_commit import (
    CommitInfo,
    add_actions_for,
    commit_empty,
    create_table,
    merge_keyed,
)
from airflow_backfill.exceptions import TargetError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from airflow_backfill.job import BackfillJob

log = logging.getLogger(__name__)

STATE_TABLE = "agg_state"


def state_uri(target: str) -> str:
    """Where the aggregate state of the MV at `target` lives."""
    return os.path.join(state_dir(target), STATE_TABLE)


def state_watermark(job: BackfillJob) -> int | None:
    """The epoch the state reflects; None when there is no state table."""
    uri = state_uri(job.target)
    if not table_exists(uri):
        return None
    version = DeltaTable(uri).transaction_version(job.app_id)
    return None if version is None else int(version)


def require_state_watermark(job: BackfillJob) -> int:
    """The state's watermark, or an error saying how to recover when it is gone."""
    watermark = state_watermark(job)
    if watermark is None:
        raise TargetError(
            f"the aggregate state of MV {job.target} ({state_uri(job.target)}) is missing: it is needed "
            "to maintain an aggregate. Rebuild the MV: delete the target and rerun the snapshot."
        )
    return watermark


def discard_state(target: str) -> bool:
    """Delete a state table left by a snapshot that crashed before creating the MV."""
    uri = state_uri(target)
    if not os.path.isdir(uri):
        return False
    shutil.rmtree(uri)
    log.info("removed the aggregate state of an unfinished snapshot: %s", uri)
    return True


def read_delta(spark: SparkSession, uri: str, version: int | None = None) -> DataFrame:
    """A Delta table's rows as of `version`, read by Spark from the files its log lists."""
    from pyspark.sql.pandas.types import from_arrow_schema

    table = DeltaTable(uri, version=version)
    schema = from_arrow_schema(arrow_schema(table))
    paths = pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()
    if not paths:
        return spark.createDataFrame([], schema)
    files = [path if os.path.isabs(path) else os.path.join(uri, path) for path in paths]
    return spark.read.schema(schema).parquet(*files)


def read_state(spark: SparkSession, job: BackfillJob) -> DataFrame:
    """The whole current state (one row per live group)."""
    return read_delta(spark, state_uri(job.target))


def state_struct(job: BackfillJob, columns: list[str]) -> StructType:
    """The state table's schema as a Spark schema, checked to hold exactly `columns`.

    Another set of columns means the job's query changed since the MV was built: its
    state cannot be reused.
    """
    from pyspark.sql.pandas.types import from_arrow_schema

    schema = from_arrow_schema(arrow_schema(DeltaTable(state_uri(job.target))))
    if schema.names != columns:
        raise TargetError(
            f"the aggregate state of MV {job.target} has columns {schema.names}, but the job's query needs "
            f"{columns}: the query changed since the MV was built. Rebuild the MV (delete the target and "
            "rerun the snapshot) or restore the query it was built with."
        )
    return schema


def create_state(job: BackfillJob, schema: pa.Schema, data_dir: str, info: CommitInfo) -> int:
    """Create the state table from the files Spark wrote in `data_dir`; returns its rows."""
    uri = state_uri(job.target)
    actions, rows = add_actions_for(uri, data_dir)
    nullable = pa.schema([field.with_nullable(True) for field in schema])
    properties = replace(info, rows=rows).properties(job)
    create_table(uri, nullable, actions, properties, name=f"{job.name}_agg_state",
                 description=f"Aggregate state of the MV of airflow_backfill job {job.name}")
    return rows


def merge_state(job: BackfillJob, changes: pa.Table, key: list[str], info: CommitInfo) -> dict:
    """Upsert changed groups, delete emptied ones (`__present` null), move the state's watermark."""
    uri = state_uri(job.target)
    target = arrow_schema(DeltaTable(uri))
    schema = pa.schema([field.with_nullable(True) for field in target] + [pa.field("__present", pa.bool_())])
    return merge_keyed(uri, changes.select(schema.names).cast(schema), key, info.properties(job),
                       null_safe_keys=True)


def commit_state_watermark(job: BackfillJob, info: CommitInfo) -> None:
    """Move the state's watermark without changing a group (a range without change rows)."""
    commit_empty(state_uri(job.target), info.properties(job))
