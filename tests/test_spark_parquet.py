"""Many local Parquet files named by the log are read without Spark's listing job, files on
an object store with it, and the session's listing threshold is left as it was."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from spark_job_count import jobs_started

from airflow_backfill.storage import files
from airflow_backfill.storage.spark_parquet import LISTING_THRESHOLD, read_parquet_files
from airflow_backfill.storage.uri import join

pytestmark = pytest.mark.spark

FILES = 40  # above Spark's default threshold of 32 paths


def _files(folder) -> list[str]:
    paths = []
    for index in range(FILES):
        path = str(folder / f"part-{index:03}.parquet")
        pq.write_table(pa.table({"k": pa.array([2 * index, 2 * index + 1], pa.int64())}), path)
        paths.append(path)
    return paths


def test_many_local_files_are_read_without_a_listing_job(spark, tmp_path):
    paths = _files(tmp_path)
    assert spark.conf.get(LISTING_THRESHOLD, None) is None
    with jobs_started(spark) as jobs:
        frame = read_parquet_files(spark, "k long", paths)
        assert jobs() == 0  # Spark would list 40 paths in a job of their own
    assert spark.conf.get(LISTING_THRESHOLD, None) is None
    assert sorted(row.k for row in frame.collect()) == list(range(2 * FILES))


def test_a_threshold_the_session_set_is_kept(spark, tmp_path):
    paths = _files(tmp_path)
    spark.conf.set(LISTING_THRESHOLD, "8")
    try:
        frame = read_parquet_files(spark, "k long", paths)
        assert spark.conf.get(LISTING_THRESHOLD) == "8"
        assert frame.count() == 2 * FILES
    finally:
        spark.conf.unset(LISTING_THRESHOLD)


def test_files_on_an_object_store_keep_sparks_listing_job(spark, s3_tables):
    folder = s3_tables["source"] + "_files"
    spark.range(2 * FILES).repartition(FILES).write.parquet(folder)
    paths = [join(folder, name) for name in files.list_names(folder) if name.endswith(".parquet")]
    assert len(paths) == FILES
    with jobs_started(spark) as jobs:
        frame = read_parquet_files(spark, "id long", paths)
        assert jobs() > 0  # each lookup is a request: Spark spreads them over its tasks
    assert spark.conf.get(LISTING_THRESHOLD, None) is None
    assert frame.count() == 2 * FILES
