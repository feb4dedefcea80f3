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
import pyarrow.compute as pc
from deltalake import DeltaTable

from airflow_backfill.engine.delta_log import arrow_schema, load_table, table_exists
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


def require_state(job: BackfillJob) -> tuple[DeltaTable, int]:
    """The state table and its watermark, or an error saying how to recover when it is gone."""
    uri = state_uri(job.target)
    table = load_table(uri) if table_exists(uri) else None
    version = table.transaction_version(job.app_id) if table is not None else None
    if table is None or version is None:
        raise TargetError(
            f"the aggregate state of MV {job.target} ({uri}) is missing: it is needed "
            "to maintain an aggregate. Rebuild the MV: delete the target and rerun the snapshot."
        )
    return table, int(version)


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


def open_state(job: BackfillJob) -> DeltaTable:
    """The state table, loaded once per round and shared by its reads and its commit."""
    return load_table(state_uri(job.target))


def read_state_rows(table: DeltaTable, keys: pa.Table) -> pa.Table:
    """The state rows of the groups in `keys` (a superset: groups sharing their first key
    value), read on the driver.

    A round touches few groups, so this is a filtered scan of the state's files, batch
    by batch, without a Spark job. Files written by Spark and by delta-rs may differ in
    physical string types: each batch is cast to the table's schema before filtering.
    """
    schema = pa.schema([field.with_nullable(True) for field in arrow_schema(table)])
    first = keys.column_names[0]
    candidates = pc.unique(keys[first].cast(schema.field(first).type))
    batches = []
    for batch in table.to_pyarrow_dataset().to_batches():
        rows = pa.Table.from_batches([batch]).select(schema.names).cast(schema)
        hits = rows.filter(pc.is_in(rows[first], value_set=candidates, skip_nulls=False))
        if hits.num_rows:
            batches.append(hits)
    return pa.concat_tables(batches) if batches else schema.empty_table()


def state_struct(job: BackfillJob, columns: list[str], table: DeltaTable | None = None) -> StructType:
    """The state table's schema as a Spark schema, checked to hold exactly `columns`.

    Another set of columns means the job's query changed since the MV was built: its
    state cannot be reused.
    """
    from pyspark.sql.pandas.types import from_arrow_schema

    schema = from_arrow_schema(arrow_schema(table if table is not None else open_state(job)))
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


def merge_state(job: BackfillJob, table: DeltaTable, changes: pa.Table, key: list[str], info: CommitInfo) -> dict:
    """Upsert changed groups, delete emptied ones (`__present` null), move the state's watermark."""
    target = arrow_schema(table)
    schema = pa.schema([field.with_nullable(True) for field in target] + [pa.field("__present", pa.bool_())])
    return merge_keyed(table, changes.select(schema.names).cast(schema), key, info.properties(job),
                       null_safe_keys=True)


def commit_state_watermark(job: BackfillJob, info: CommitInfo) -> None:
    """Move the state's watermark without changing a group (a range without change rows)."""
    commit_empty(open_state(job), info.properties(job))
