"""Deletion vectors as the driver reads and writes them are Delta's: it reads the vectors
Spark writes, Spark and delta-rs read the ones it writes, and a damaged one is refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder

from airflow_backfill.engine.delta.deletion_vectors import (
    DeletionVectorError,
    deleted_rows,
    vector_path,
    write_vectors,
    z85_decode,
    z85_encode,
)
from airflow_backfill.engine.delta.keyed_rows import FILE, POSITION, find_rows
from airflow_backfill.engine.delta.log_state import table_state
from airflow_backfill.engine.delta.patch_actions import marked_files
from airflow_backfill.engine.delta.transaction_write import patch_with_watermark
from airflow_backfill.storage import files


def test_z85_is_the_codec_of_the_protocols_reference():
    # The Z85 specification's test vector.
    assert z85_encode(bytes.fromhex("864FD26FB559F75B")) == "HelloWorld"
    data = bytes(range(256)) * 2
    assert z85_decode(z85_encode(data)) == data
    with pytest.raises(DeletionVectorError):
        z85_decode("Hello~orld")


def test_positions_round_trip_through_a_vector_file(tmp_path):
    vectors = [np.array([0, 5, 70_000, 2**33 + 1], np.uint64), np.array([], np.uint64), np.arange(0, 9000, 3)]
    descriptors = write_vectors(str(tmp_path), vectors)
    assert len({d["pathOrInlineDv"] for d in descriptors}) == 1  # one file for the commit
    for written, descriptor in zip(vectors, descriptors, strict=True):
        assert descriptor["cardinality"] == len(written)
        assert deleted_rows(str(tmp_path), descriptor).tolist() == sorted(written.tolist())


def test_a_damaged_vector_is_refused(tmp_path):
    (descriptor,) = write_vectors(str(tmp_path), [np.array([1, 2, 3], np.uint64)])
    path = vector_path(str(tmp_path), descriptor)
    content = bytearray(Path(path).read_bytes())
    content[-6] ^= 0xFF  # a bit of the bitmap, so its checksum no longer holds
    Path(path).write_bytes(bytes(content))
    with pytest.raises(DeletionVectorError, match="damaged"):
        deleted_rows(str(tmp_path), descriptor)


@pytest.mark.spark
def test_the_vectors_spark_writes_are_read_and_the_ones_written_here_read_by_spark_and_delta_rs(spark, tmp_path):
    uri = str(tmp_path / "t")
    (spark.range(0, 3000).selectExpr("id", "id % 7 AS g").repartition(3).write.format("delta")
     .option("delta.enableDeletionVectors", "true").option("delta.enableChangeDataFeed", "true").save(uri))
    spark.sql(f"DELETE FROM delta.`{uri}` WHERE id % 10 = 3")
    state = table_state(uri)
    assert all(live.deletion_vector for live in state.files)
    for live in state.files:  # Spark's vectors mark exactly the positions of the deleted ids
        ids = files.read_parquet_columns(live.uri, ["id"]).column("id").to_numpy()
        assert deleted_rows(uri, live.deletion_vector).tolist() == np.flatnonzero(ids % 10 == 3).tolist()

    keys = pa.table({"id": pa.array(range(0, 3000, 11), pa.int64())})
    found = find_rows(state, ["id"], keys, ["g"])
    assert sorted(found.rows.column("id").to_pylist()) == [i for i in range(0, 3000, 11) if i % 10 != 3]
    marked = marked_files(found.files, found.rows.column(FILE).to_numpy(), found.rows.column(POSITION).to_numpy())
    assert patch_with_watermark(spark, uri, read_version=state.version, marked=marked, rows=None, changes=None,
                                app_id="a", version=1, user_metadata="{}", predicate="test")
    expected = sorted(i for i in range(3000) if i % 10 != 3 and i % 11 != 0)
    assert sorted(r.id for r in spark.read.format("delta").load(uri).select("id").collect()) == expected
    counted = QueryBuilder().register("t", DeltaTable(uri)).execute("SELECT id FROM t").read_all()
    assert sorted(pa.table(counted).column("id").to_pylist()) == expected
    entry = Path(uri, "_delta_log", f"{2:020d}.json").read_text().splitlines()
    added = [json.loads(line)["add"] for line in entry if '"add"' in line]
    assert all(json.loads(add["stats"])["tightBounds"] is False for add in added)
