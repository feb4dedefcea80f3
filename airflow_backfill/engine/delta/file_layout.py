"""How Spark lays out the data files of an MV it writes in bulk (the snapshot's chunks, a
large aggregate's MV): rows sorted by the MV's key within each file, files of at most
`sizes.mv_file_rows` rows, Parquet row groups of at most `sizes.mv_row_group_rows` rows.

Why: a round finds a changed key's rows through the files' statistics, then through their
row groups' (`keyed_rows`), reads the key column of what is left and marks the rows in
deletion vectors. Unsorted, a file or row group spans most keys and a change reads and
touches most of them; sorted and bounded, keys that lie together (recent orders, one
customer's) fall in a few files and a few row groups. The rows are sorted where they are
(`sortWithinPartitions`, no shuffle): the snapshot reads the upstream in key order, so
each partition already holds runs of neighbouring keys.

The row-group bound is Parquet's writer setting `parquet.block.row.count.limit` (with a
dictionary bound to match), which Delta's writer reads from the session's settings: it
is set around the write only, so other writes of the session keep Parquet's defaults (a
write of another thread that overlaps one gets the bounds too, which changes its row
groups, never its rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from airflow_backfill.engine.planning.aggregate_sql import quote
from airflow_backfill.engine.session_settings import session_settings
from airflow_backfill.engine.sizes import sizes

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

ROW_GROUP_ROWS = "parquet.block.row.count.limit"
"""Parquet's bound on a row group's rows (parquet-hadoop 1.12 and later)."""
DICTIONARY_BYTES = "parquet.dictionary.page.size"
"""The size at which Parquet's writer gives up a column chunk's dictionary for plain values."""
DICTIONARY_BYTES_PER_ROW = 2
"""A row group's dictionary is given up past 2 bytes a row: a quarter of its 8-byte values
distinct, beyond which plain values take about as little room. Why: Parquet's default (1
MiB) holds every value of a small row group's high-cardinality column (ids, amounts,
times), so the writer hashes all of them into a dictionary it then drops; writing 2 M rows
of six columns took 3.12 s of CPU in row groups of 16,384 rows, 1.27 s with this bound and
1.36 s in Parquet's own 128 MiB row groups, the files' sizes within 0.3 % of each other."""
SMALLEST_DICTIONARY_BYTES = 1024
"""Parquet's writer refuses a dictionary bound below its first buffer (64 bytes)."""
FILE_ROWS = "maxRecordsPerFile"
"""The writer option bounding a file's rows (one of the two Delta hands to Spark's writer)."""


def keyed(frame: DataFrame, key: Sequence[str]) -> DataFrame:
    """`frame` sorted by `key` within each partition, when MV files are laid out by key
    (`sizes.mv_file_rows` above zero): a sort per task, no shuffle."""
    if not key or not sizes().mv_file_rows:
        return frame
    return frame.sortWithinPartitions(*(quote(column) for column in key))


def file_options() -> dict[str, str]:
    """Delta writer options bounding the rows of each file written."""
    rows = sizes().mv_file_rows
    return {FILE_ROWS: str(rows)} if rows else {}


def bounded_row_groups(spark: SparkSession) -> AbstractContextManager[None]:
    """Parquet row groups of at most `sizes.mv_row_group_rows` rows for the writes of the
    block (Parquet's own bound, 128 MiB a row group, with zero)."""
    rows = sizes().mv_row_group_rows
    if not rows:
        return session_settings(spark, {})
    dictionary = max(rows * DICTIONARY_BYTES_PER_ROW, SMALLEST_DICTIONARY_BYTES)
    return session_settings(spark, {ROW_GROUP_ROWS: str(rows), DICTIONARY_BYTES: str(dictionary)})
