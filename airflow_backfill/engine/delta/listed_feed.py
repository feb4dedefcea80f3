"""A range's change feed read by Spark straight from the files its log lists.

Why: Delta's change-feed relation plans its own scan of the range (0.3 s), and a round
that needs the range's row count then caches and counts it (0.6 s more for the 120 k
change rows of an RF1 + RF2 pair at TPC-H SF 10), where the log and the files' footers
already say which files hold the rows and how many there are. A range of the shape the
driver reads (`driver_feed`) whose files are all read whole (change files, files appended
or removed whole without deletion vectors) but too large to hold is read here with
Spark's Parquet reader, given the table's schema, so nothing is planned but the scan of
those files and nothing is counted. Files of which a deletion vector selects rows are
left to Delta's reader, which filters them by row index as it scans.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from itertools import groupby
from typing import TYPE_CHECKING

from airflow_backfill.engine.delta.change_feed import (
    ARRIVING,
    CHANGE_TYPE,
    COMMIT_VERSION,
    check_range_readable,
)
from airflow_backfill.engine.delta.driver_feed import range_files, range_schema
from airflow_backfill.engine.delta.log import load_table
from airflow_backfill.engine.sizes import sizes
from airflow_backfill.storage import files
from airflow_backfill.storage.spark_parquet import read_parquet_files

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

_READER_FEATURES_LEFT_TO_DELTA = frozenset({"typeWidening", "typeWidening-preview"})
"""Files of a widened column hold the narrower type, which Delta's reader converts."""


@dataclass(frozen=True)
class ListedFeed:
    """A range's change rows, lazily read by Spark, with their count from the log."""

    frame: DataFrame
    """The upstream's requested columns plus `_change_type` and `_commit_version`, as
    `change_feed.read_change_feed` gives them."""
    rows: int
    """Change rows in the range (the files' footers and statistics)."""
    arriving: int
    """Rows that bring a row in (inserts and post-images): an appended file's rows, and the
    change files' from their `_change_type` column, read by the driver."""
    upstream: StructType
    """The upstream's columns, all of them, as Spark types."""


def listed_feed(spark: SparkSession, source: str, watermark: int, end_version: int,
                columns: list[str]) -> ListedFeed | None:
    """The change rows of versions (watermark, end_version] read from the files the log
    lists, or None when the range has another shape (then Spark's change-feed reader
    reads it). The range is checked as that reader's is (`check_range_readable`)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    check_range_readable(source, watermark, end_version)
    if set(load_table(source).protocol().reader_features or []) & _READER_FEATURES_LEFT_TO_DELTA:
        return None
    upstream = range_schema(source, end_version)
    found = None if upstream is None else range_files(source, watermark, end_version, sizes().listed_feed_rows,
                                                      max_bytes=sizes().listed_feed_bytes, in_part=False)
    if upstream is None or found is None:
        return None
    fields = {field.name: field for field in upstream.fields}
    if any(column not in fields for column in columns):
        return None
    wanted = [fields[column] for column in columns]
    parts = []
    for (version, is_cdc, change_type), group in groupby(
            found, key=lambda change: (change.version, change.is_cdc, change.change_type)):
        uris = [change.uri for change in group]
        if is_cdc:
            read = read_parquet_files(spark, StructType([*wanted, StructField(CHANGE_TYPE, StringType())]), uris)
            kind = F.col(CHANGE_TYPE)
        else:
            read = read_parquet_files(spark, StructType(wanted), uris)
            kind = F.lit(change_type)
        parts.append(read.select(*(F.col(f"`{c}`") for c in columns), kind.alias(CHANGE_TYPE),
                                 F.lit(version).cast("long").alias(COMMIT_VERSION)))
    if not parts:
        return None
    frame = parts[0]
    for part in parts[1:]:
        frame = frame.unionByName(part)
    rows = sum(change.rows for change in found)
    arriving = sum(_arriving_rows(change.uri) if change.is_cdc else change.rows
                   for change in found if change.is_cdc or change.change_type in ARRIVING)
    log.info("change feed of versions %s..%s read from %s listed files: %s rows", watermark + 1, end_version,
             len(found), rows)
    return ListedFeed(frame, rows, arriving, upstream)


def _arriving_rows(uri: str) -> int:
    """Rows of a change file whose change type brings a row in (its one column read)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kinds = files.read_parquet_columns(uri, [CHANGE_TYPE]).column(CHANGE_TYPE).cast(pa.string())
    return int(pc.sum(pc.is_in(kinds, value_set=pa.array(ARRIVING)).cast(pa.int64())).as_py() or 0)
