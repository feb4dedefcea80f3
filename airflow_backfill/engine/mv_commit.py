"""Commit to the MV's Delta log through delta-rs, always with the app transaction.

Every commit carries the MV's new watermark (app transaction `airflow_backfill/<job>`,
version = the upstream epoch the MV now reflects) in the same atomic log entry as its
data, so readers and retries see data and watermark change together or not at all.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Schema, Transaction
from deltalake.transaction import AddAction, create_table_with_add_actions

from airflow_backfill.engine.delta_log import CDF_PROPERTY, METADATA_PREFIX, arrow_schema, load_table
from airflow_backfill.exceptions import TargetError

if TYPE_CHECKING:
    from airflow_backfill.job import BackfillJob

log = logging.getLogger(__name__)

PRESENT = "__present"
"""Column of keyed changes: true for a key's new row, null when the key leaves the table."""


@dataclass(frozen=True)
class CommitInfo:
    """What one MV commit records besides its data."""

    phase: str
    epoch: int
    parallelism: int
    rows: int
    extra: dict[str, str] = field(default_factory=dict)

    def properties(self, job: BackfillJob) -> CommitProperties:
        metadata = {
            "job": job.name,
            "source": job.source,
            "query": job.query,
            "epoch": str(self.epoch),
            "phase": self.phase,
            "parallelism": str(self.parallelism),
            "rows": str(self.rows),
            **self.extra,
        }
        return CommitProperties(
            custom_metadata={METADATA_PREFIX + key: value for key, value in metadata.items()},
            app_transactions=[Transaction(app_id=job.app_id, version=self.epoch)],
        )


def add_actions_for(table_root: str, data_dir: str) -> tuple[list[AddAction], int]:
    """Add actions (with row-count stats) for the Parquet files Spark wrote in `data_dir`."""
    actions: list[AddAction] = []
    total_rows = 0
    for name in sorted(os.listdir(data_dir)):
        if not name.endswith(".parquet") or name.startswith((".", "_")):
            continue
        path = os.path.join(data_dir, name)
        rows = pq.read_metadata(path).num_rows
        total_rows += rows
        stat = os.stat(path)
        actions.append(
            AddAction(
                path=os.path.relpath(path, table_root),
                size=stat.st_size,
                partition_values={},
                modification_time=int(stat.st_mtime * 1000),
                data_change=True,
                stats=json.dumps({"numRecords": rows}),
            )
        )
    return actions, total_rows


def create_table(
    uri: str, schema: pa.Schema, actions: list[AddAction], properties: CommitProperties, *,
    name: str, description: str, configuration: dict[str, str | None] | None = None,
) -> None:
    """Create a Delta table from already written files in one commit (fails if it exists)."""
    create_table_with_add_actions(
        uri,
        Schema.from_arrow(schema),
        actions,
        mode="error",
        name=name,
        description=description,
        configuration=configuration,
        commit_properties=properties,
    )


def create_mv(job: BackfillJob, schema: pa.Schema, actions: list[AddAction], info: CommitInfo) -> None:
    """Create the MV table from Spark-written files in one commit (fails if it exists)."""
    try:
        create_table(
            job.target, schema, actions, info.properties(job), name=job.name,
            description=f"Materialized view maintained by airflow_backfill job {job.name}",
            configuration={CDF_PROPERTY: "true"},
        )
    except Exception as error:
        if "exists" in str(error).lower():
            raise TargetError(
                f"target {job.target} was created by another run while this snapshot ran; "
                "only one run per job may write the MV. Nothing was committed by this run."
            ) from None
        raise
    log.info("created MV %s at epoch %s with %s rows", job.target, info.epoch, info.rows)


def conform_changes(changes: pa.Table, table: DeltaTable) -> pa.Table:
    """Cast keyed changes to the table's exact types (plus `__present`) so a merge never widens them."""
    target = arrow_schema(table)
    fields = [target.field(name) for name in target.names] + [pa.field(PRESENT, pa.bool_())]
    schema = pa.schema([f.with_nullable(True) for f in fields])
    return changes.select(schema.names).cast(schema)


def merge_changes(
    job: BackfillJob, changes: pa.Table, mv_key: tuple[str, ...], info: CommitInfo, *,
    null_safe_keys: bool = False, deletes_known: bool = False, table: DeltaTable | None = None,
) -> dict:
    """Apply keyed upserts and deletes to the MV and move its watermark, in one commit.

    `changes` has the MV's columns plus `__present`: true for the new row of a key, null
    when the key left the MV (upstream delete, or its new image fails the WHERE).
    `null_safe_keys`: keys may be NULL and NULL matches NULL (aggregate groups).
    `deletes_known`: the caller guarantees every delete names a key the MV has, so the
    MV is not read to filter them. `table`: the MV as already loaded by the caller.
    """
    table = table if table is not None else load_table(job.target)
    if not deletes_known:
        changes = _drop_deletes_of_unknown_keys(table, changes, mv_key)
    started = time.monotonic()
    metrics = merge_keyed(table, changes, list(mv_key), info.properties(job), null_safe_keys=null_safe_keys)
    log.info(
        "merged %s changed keys into %s at epoch %s in %.2fs (%s)",
        changes.num_rows, job.target, info.epoch, time.monotonic() - started, metrics or "no data change",
    )
    return metrics


def merge_keyed(
    table: DeltaTable, changes: pa.Table, key: list[str], properties: CommitProperties, *, null_safe_keys: bool
) -> dict:
    """Upsert rows with `__present` true and delete matched rows with `__present` null, in one
    commit carrying `properties`; an empty commit with them when nothing changes."""
    equal = "IS NOT DISTINCT FROM" if null_safe_keys else "="
    predicate = " AND ".join(f"(t.{_quote(column)} {equal} s.{_quote(column)})" for column in key)
    values = {column: f"s.{_quote(column)}" for column in changes.column_names if column != PRESENT}
    metrics: dict = {}
    if changes.num_rows:
        metrics = (
            table.merge(
                changes,
                predicate=predicate,
                source_alias="s",
                target_alias="t",
                commit_properties=properties,
            )
            .when_matched_delete(predicate=f"s.{PRESENT} IS NULL")
            .when_matched_update(updates=values, predicate=f"s.{PRESENT} IS NOT NULL")
            .when_not_matched_insert(updates=values, predicate=f"s.{PRESENT} IS NOT NULL")
            .execute()
        )
    if not metrics.get("num_target_files_added") and not metrics.get("num_target_files_removed"):
        # Nothing to rewrite (or no changes at all): still move the watermark.
        commit_empty(table, properties)
    return metrics


def _drop_deletes_of_unknown_keys(table: DeltaTable, changes: pa.Table, mv_key: tuple[str, ...]) -> pa.Table:
    """Keep only the deletes whose key is in the MV.

    A source row that matches nothing and inserts nothing still goes through delta-rs's
    NOT NULL validation as an all-null row and fails the merge, so such rows (a key that
    was inserted and deleted between two watermarks, or never passed the WHERE) must
    not reach it. Keys are compared as Python tuples, so a NULL key part matches NULL
    (Arrow joins never do).
    """
    absent_mask = pc.is_null(changes[PRESENT])
    absent = changes.filter(absent_mask)
    if not absent.num_rows:
        return changes
    known = _keys_in_table(table, absent.select(list(mv_key)))
    absent_keys = zip(*(absent.column(column).to_pylist() for column in mv_key), strict=True)
    keep = pa.array([key in known for key in absent_keys], pa.bool_())
    return pa.concat_tables([changes.filter(pc.invert(absent_mask)), absent.filter(keep)])


def _keys_in_table(table: DeltaTable, keys: pa.Table) -> set[tuple]:
    """Which of `keys` the table holds: its key columns are scanned batch by batch and only
    rows whose first key column is a candidate are kept (files written by Spark and by
    delta-rs may differ in physical string types, so the filter runs after a cast)."""
    first = keys.column_names[0]
    candidates = pc.unique(keys[first])
    found: set[tuple] = set()
    for batch in table.to_pyarrow_dataset().to_batches(columns=keys.column_names):
        hits = batch.filter(pc.is_in(batch.column(first).cast(candidates.type), value_set=candidates))
        found.update(zip(*(hits.column(name).to_pylist() for name in keys.column_names), strict=True))
    return found


def nullable_key(table: DeltaTable, key: tuple[str, ...]) -> bool:
    """True when a key column of the table may hold NULL (then merges must match NULL to NULL)."""
    schema = arrow_schema(table)
    return any(schema.field(column).nullable for column in key)


def commit_watermark_only(job: BackfillJob, info: CommitInfo) -> None:
    """An empty commit that only records the new watermark (the epochs changed nothing here)."""
    commit_empty(load_table(job.target), info.properties(job))


def commit_empty(table: DeltaTable, properties: CommitProperties) -> None:
    """A commit without data: it only carries `properties` (the watermark, the metadata)."""
    table.create_write_transaction([], mode="append", schema=table.schema(), commit_properties=properties)


def _quote(column: str) -> str:
    return '"' + column.replace('"', '""') + '"'
