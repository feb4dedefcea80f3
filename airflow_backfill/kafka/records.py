"""Spark reads of Kafka records with explicit per-partition offset ranges, decoded by the value schema."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from airflow_backfill.exceptions import UpstreamError
from airflow_backfill.kafka.topic import KafkaTopic

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

CORRUPT_COLUMN = "_corrupt_record"


class RecordDecodeError(UpstreamError):
    """A record's value is not JSON of the declared value schema."""


def _raw(spark: SparkSession, upstream: KafkaTopic, ranges: dict[int, tuple[int, int]], min_partitions: int) -> DataFrame:
    """The raw records of `[start, end)` of each partition in `ranges`."""
    from airflow_backfill.kafka.connection import broker_settings

    topic = upstream.topic
    return (
        spark.read.format("kafka")
        .options(**broker_settings(upstream).spark_options())
        .option("assign", json.dumps({topic: sorted(ranges)}))
        .option("startingOffsets", json.dumps({topic: {str(p): start for p, (start, _) in ranges.items()}}))
        .option("endingOffsets", json.dumps({topic: {str(p): end for p, (_, end) in ranges.items()}}))
        .option("failOnDataLoss", "true")
        .option("minPartitions", str(min_partitions))
        .load()
    )


def record_schema_ddl(upstream: KafkaTopic) -> str:
    """The schema of a decoded record: key, the value's fields, then partition, offset, timestamp."""
    return f"key STRING, {upstream.value_schema}, _partition INT, _offset BIGINT, _timestamp TIMESTAMP"


def decode(raw: DataFrame, upstream: KafkaTopic, mode: str = "FAILFAST") -> DataFrame:
    """Decode Kafka's `key`/`value` bytes into the record schema (FAILFAST: a bad value fails the read)."""
    from pyspark.sql import functions as F

    value = F.from_json(F.col("value").cast("string"), upstream.value_schema, {"mode": mode})
    return raw.select(
        F.col("key").cast("string").alias("key"),
        value.alias("v"),
        F.col("partition").alias("_partition"),
        F.col("offset").alias("_offset"),
        F.col("timestamp").alias("_timestamp"),
    ).select("key", "v.*", "_partition", "_offset", "_timestamp")


def empty_records(spark: SparkSession, upstream: KafkaTopic) -> DataFrame:
    return spark.createDataFrame([], record_schema_ddl(upstream))


def read_records(
    spark: SparkSession, upstream: KafkaTopic, ranges: dict[int, tuple[int, int]], min_partitions: int = 1
) -> DataFrame:
    """Decoded records of `[start, end)` per partition (an empty frame when `ranges` is empty)."""
    ranges = {p: r for p, r in ranges.items() if r[1] > r[0]}
    if not ranges:
        return empty_records(spark, upstream)
    return decode(_raw(spark, upstream, ranges, min_partitions), upstream)


def first_undecodable(
    spark: SparkSession, upstream: KafkaTopic, ranges: dict[int, tuple[int, int]]
) -> tuple[int, int, str] | None:
    """(partition, offset, value) of the first record the value schema cannot decode, if any."""
    from pyspark.sql import functions as F

    ranges = {p: r for p, r in ranges.items() if r[1] > r[0]}
    if not ranges:
        return None
    schema = f"{upstream.value_schema}, {CORRUPT_COLUMN} STRING"
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_COLUMN}
    raw = _raw(spark, upstream, ranges, 1).withColumn("text", F.col("value").cast("string"))
    parsed = raw.withColumn("v", F.from_json("text", schema, options))
    bad = parsed.where(
        F.col("text").isNotNull() & (F.col("v").isNull() | F.col(f"v.{CORRUPT_COLUMN}").isNotNull())
    ).orderBy("partition", "offset").limit(1).collect()
    if not bad:
        return None
    return int(bad[0]["partition"]), int(bad[0]["offset"]), str(bad[0]["text"])


def decode_error(upstream: KafkaTopic, bad: tuple[int, int, str]) -> RecordDecodeError:
    partition, offset, text = bad
    return RecordDecodeError(
        f"record at offset {offset} of partition {partition} of topic {upstream.topic!r} is not a JSON "
        f"object matching value_schema '{upstream.value_schema}': {text[:200]!r}. Nothing was written; "
        "fix the producer (or delete the record with retention), or change value_schema."
    )
