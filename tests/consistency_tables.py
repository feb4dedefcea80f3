"""Hand-built upstreams and MVs for the consistent-read tests, written with delta-rs only.

An MV commit here writes the rows and records its watermark the way the engine does:
the app transaction `airflow_backfill/<job>` and, in the commit's userMetadata, the job,
its source and (for a join) the vector of upstream versions, or (for a Kafka MV) the
source table version it reflects.
"""

from __future__ import annotations

import json

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake


def upstream(uri: str, versions: int) -> str:
    """A table with versions 0..versions-1, version v holding one row per earlier version."""
    for version in range(versions):
        write_deltalake(uri, pa.table({"id": pa.array([version], pa.int64())}), mode="append",
                        configuration={"delta.enableChangeDataFeed": "true"})
    return uri


def append_upstream(uri: str) -> int:
    """One more upstream version (one more row); the new version."""
    version = DeltaTable(uri).version() + 1
    write_deltalake(uri, pa.table({"id": pa.array([version], pa.int64())}), mode="append")
    return version


def mv_commit(target: str, job: str, source: str | dict[str, str], watermark: int | None = None, *,
              vector: dict[str, int] | None = None, recorded: int | None = None, kafka_round: int | None = None,
              phase: str = "forward") -> int:
    """One MV commit (an overwrite with a row naming its epochs) by `phase`; the MV's new version.

    `watermark`: an MV over one upstream; `vector`: a join (the app transaction is the
    sum); `kafka_round` with `recorded`: a Kafka MV (app transaction = round, the source
    table version in `airflow_backfill.watermark`, None while splits are not Finished).
    """
    metadata: dict[str, str | None] = {"airflow_backfill.phase": phase}
    if kafka_round is not None:
        txn = kafka_round
        metadata["airflow_backfill.watermark"] = None if recorded is None else recorded
        metadata["airflow_backfill.kafka_round"] = str(kafka_round)
        label = f"kafka {recorded}"
    else:
        metadata["airflow_backfill.job"] = job
        metadata["airflow_backfill.source"] = source if isinstance(source, str) else json.dumps(source, sort_keys=True)
        if vector is not None:
            txn = sum(vector.values())
            metadata["airflow_backfill.watermarks"] = json.dumps(vector, sort_keys=True)
            label = json.dumps(vector, sort_keys=True)
        else:
            assert watermark is not None
            txn = watermark
            label = str(watermark)
    write_deltalake(
        target, pa.table({"epochs": [label]}), mode="overwrite",
        configuration={"delta.enableChangeDataFeed": "true"},
        commit_properties=CommitProperties(custom_metadata={"userMetadata": json.dumps(metadata)},
                                           app_transactions=[Transaction(f"airflow_backfill/{job}", txn)]),
    )
    return DeltaTable(target).version()


def mv(target: str, job: str, source: str, watermarks: list[int]) -> list[int]:
    """An MV over one upstream committed at each of `watermarks`; its versions."""
    return [mv_commit(target, job, source, watermark) for watermark in watermarks]


def rows_unchanged(target: str) -> int:
    """A commit that changes no rows (a table property; OPTIMIZE's rewrites are dataChange
    false alike); the new version."""
    table = DeltaTable(target)
    table.alter.set_table_properties({"delta.logRetentionDuration": f"interval {30 + table.version()} days"})
    return DeltaTable(target).version()


def foreign_write(target: str) -> int:
    """A commit that changes rows without the job's app transaction; the new version."""
    write_deltalake(target, pa.table({"epochs": ["foreign"]}), mode="append")
    return DeltaTable(target).version()


def rows_at(target: str, version: int) -> list[str]:
    """The `epochs` labels the MV holds at `version`."""
    return sorted(DeltaTable(target, version=version).to_pyarrow_table().column("epochs").to_pylist())
