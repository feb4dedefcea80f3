"""Small tables read and overwritten from the file list their checksum carries.

Why: before Delta 4.4 reads or overwrites a version of a table for the first time, it
rebuilds that version's state from the log (three Spark jobs, 0.5 - 0.6 s even for a
table of four rows; docs/benchmarks.md). An aggregate's round reads and overwrites two
such tables (its state and its MV), each at a version the previous round just made.
But Delta also writes every version's whole file list into the version's checksum file
(`.crc`, `VersionChecksum.allFiles`) while the table has fewer files than a threshold
(50 by default; the engine's sessions raise it to `sizes.listed_files`), computed
at commit time from the previous list and the commit's actions, and it keeps the list
of the version it just committed in memory. Delta itself reads that list only to
verify it; this module reads and overwrites from it:

- `read_table`: a DataFrame over exactly the listed files (Delta's own
  `DeltaLog.createDataFrame`, so deletion vectors and column types are applied as a
  Delta read applies them);
- `listed_files` for `transaction_write`: an overwrite removes the listed files
  (`AddFile.removeWithTimestamp`, as Delta's overwrite does) instead of asking the
  rebuilt state for them;
- `listed_rows`: the rows of a small table read by the driver from the listed files
  (no deletion vectors), where a Spark read and collect is a job of about 0.1 s.

When a version's checksum carries no list (more files than the threshold, no `.crc`,
another writer), everything falls back to Delta's reader and writer as they are.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from airflow_backfill.engine.delta.arrow_types import arrow_schema_of
from airflow_backfill.engine.delta.log import still_newest
from airflow_backfill.engine.internals import (
    added_file,
    checksum_files,
    files_frame,
    latest_snapshot,
    plain_layout,
    scala_items,
    snapshot_version,
)
from airflow_backfill.engine.sizes import sizes
from airflow_backfill.storage import files
from airflow_backfill.storage.uri import join

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)


def read_table(spark: SparkSession, uri: str, version: int | None = None) -> DataFrame:
    """The Delta table at `uri` as of `version` (None: its latest version), pinned to that
    version's files: from the checksum's file list when the version is the latest and its
    checksum lists its files, else through Delta's reader."""
    log, snapshot = latest_snapshot(spark, uri, still_newest(uri))
    files = listed_files(snapshot) if version is None or snapshot_version(snapshot) == version else None
    if files is None:
        pinned = snapshot_version(snapshot) if version is None else version
        return spark.read.format("delta").option("versionAsOf", pinned).load(uri)
    return files_frame(spark, log, snapshot, files)


def listed_files(snapshot: Any) -> Any | None:
    """The snapshot's live files (a Scala `Seq[AddFile]`) as its checksum lists them, or
    None when it lists none or more than `sizes.listed_files`, or when the table is
    partitioned or maps column names (cases the overwrite in `transaction_write` leaves to
    Delta's own writer)."""
    if not plain_layout(snapshot):
        return None
    listed = checksum_files(snapshot)
    if listed is None or listed[1] > sizes().listed_files:
        return None
    return listed[0]


def listed_rows(spark: SparkSession, uri: str, version: int | None, schema: StructType) -> pa.Table | None:
    """The rows of the table at `uri` as of `version` (its latest; None: whichever version
    that is), columns and types of `schema`, read by the driver from the Parquet files its
    checksum lists; None when it lists none, or a file has a deletion vector or lacks a
    column, or a type does not convert (then the caller reads through Spark)."""
    import pyarrow as pa
    from pyspark.errors import PySparkException

    _, snapshot = latest_snapshot(spark, uri, still_newest(uri))
    listed = listed_files(snapshot) if version is None or snapshot_version(snapshot) == version else None
    if listed is None:
        return None
    try:
        target = arrow_schema_of(schema)
    except (PySparkException, TypeError):
        return None
    parts = []
    for added in scala_items(listed):
        path, has_vector, _ = added_file(added)
        if has_vector:
            return None
        path = unquote(path)
        read = files.read_parquet_columns(path if "://" in path else join(uri, path), schema.names)
        try:
            parts.append(pa.table([read.column(name).cast(field.type) for name, field in zip(
                schema.names, target, strict=True)], schema=target))
        except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
            log.info("rows of %s left to Spark: %s", uri, error)
            return None
    return pa.concat_tables(parts) if parts else target.empty_table()
