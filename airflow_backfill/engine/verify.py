"""Check an MV against its query recomputed from scratch, at the MV's watermark.

An incrementally maintained MV is only as good as the claim that it equals the query
on the upstream as of its watermark. `verify_mv` tests that claim with Spark: it reads
one MV version and the watermark committed with it, recomputes the query on the
upstream as of that epoch (Delta time travel), and compares the two in two passes:

1. per key range (a hash bucket of the MV key): row count and a checksum of the rows;
   equal ranges are done without moving a row to the driver;
2. within the ranges that differ, a keyed comparison that finds the first differing
   keys (missing, extra, duplicated or changed rows). Floating-point values compare
   with a relative tolerance, since incremental sums round differently from a recount.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_backfill.exceptions import TargetError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from airflow_backfill.job import BackfillJob

log = logging.getLogger(__name__)

DEFAULT_KEY_RANGES = 64
"""Hash buckets of the MV key compared by checksum before any row is compared."""
RELATIVE_TOLERANCE = 1e-9
"""Floating-point values closer than this (relative to their size, at least 1) are equal."""
_BUCKET = "__verify_bucket"
_HASH = "__verify_hash"


@dataclass(frozen=True)
class Difference:
    """One key whose rows differ: `kind` is missing, extra, duplicate or changed."""

    key: dict[str, Any]
    kind: str
    expected: dict[str, Any] | None = None
    actual: dict[str, Any] | None = None


@dataclass(frozen=True)
class VerifyReport:
    """The outcome of one verification of MV version `mv_version` at `watermark`."""

    mv_version: int
    watermark: int
    expected_rows: int
    actual_rows: int
    key_ranges: int
    differing_ranges: int
    differences: list[Difference] = field(default_factory=list)

    @property
    def equal(self) -> bool:
        return not self.differences and self.expected_rows == self.actual_rows

    def lines(self) -> list[str]:
        """The report as the CLI prints it."""
        verdict = "EQUAL" if self.equal else "DIFFERENT"
        lines = [
            f"{verdict}: MV version {self.mv_version} at watermark {self.watermark}",
            f"rows: expected {self.expected_rows}, MV {self.actual_rows}",
            f"key ranges: {self.differing_ranges} of {self.key_ranges} differ",
        ]
        for difference in self.differences:
            line = f"  {difference.kind} key {difference.key}"
            if difference.expected is not None:
                line += f" expected {difference.expected}"
            if difference.actual is not None:
                line += f" MV {difference.actual}"
            lines.append(line)
        return lines


def mv_version_and_watermark(job: BackfillJob) -> tuple[int, int]:
    """The MV's latest version and the watermark committed with it (one consistent pair)."""
    from airflow_backfill.engine.delta.log import delta_table, table_exists

    if not table_exists(job.target):
        raise TargetError(f"MV {job.target} does not exist yet: run the job's snapshot phase first.")
    table = delta_table(job.target)
    watermark = table.transaction_version(job.app_id)
    if watermark is None:
        raise TargetError(
            f"MV {job.target} has no watermark for {job.app_id!r}: it was not written by job "
            f"{job.name!r}; check the job's `name` and `target`."
        )
    return table.version(), watermark


def verify_mv(
    spark: SparkSession, job: BackfillJob, *, key_ranges: int = DEFAULT_KEY_RANGES, show: int = 5
) -> VerifyReport:
    """Compare the MV's latest version with the query on the upstream at its watermark."""
    mv_version, watermark = mv_version_and_watermark(job)
    key = list(_bind_upstreams(spark, job, mv_version, watermark))
    expected = spark.sql(job.query)
    columns = expected.columns
    actual = spark.read.format("delta").option("versionAsOf", mv_version).load(job.target).select(*columns)
    expected_ranges = _range_checksums(_bucketed(expected, key, columns, key_ranges))
    actual_ranges = _range_checksums(_bucketed(actual, key, columns, key_ranges))
    differing = _differing_ranges(expected_ranges, actual_ranges)
    differences: list[Difference] = []
    if differing:
        differences = first_differences(expected, actual, key, columns, key_ranges, differing, show)
    return VerifyReport(
        mv_version=mv_version, watermark=watermark,
        expected_rows=sum(rows for rows, _ in expected_ranges.values()),
        actual_rows=sum(rows for rows, _ in actual_ranges.values()),
        key_ranges=key_ranges, differing_ranges=len(differing), differences=differences,
    )


def _bind_upstreams(spark: SparkSession, job: BackfillJob, mv_version: int, watermark: int) -> tuple[str, ...]:
    """Bind each upstream, as of the version MV version `mv_version` reflects, to the name
    the query reads it by; returns the MV key."""
    from airflow_backfill.engine.planning.query import plan_query

    if job.is_join:
        from airflow_backfill.engine.joins.rounds import join_plan
        from airflow_backfill.engine.joins.watermarks import table_vector

        vector = table_vector(job.target, job.app_id, [u.name for u in job.upstreams], up_to=mv_version)
        assert vector is not None  # the MV has a watermark
        versions = {upstream.table: vector[upstream.name] for upstream in job.upstreams}
        mv_key = join_plan(job, vector).mv_key
    else:
        versions = {job.source: watermark}
        mv_key = plan_query(job.query, job.primary_key).mv_key
    for upstream in job.upstreams:
        log.info("verifying MV %s version %s against %s as of version %s", job.target, mv_version, upstream.table,
                 versions[upstream.table])
        spark.read.format("delta").option("versionAsOf", versions[upstream.table]).load(upstream.table) \
            .createOrReplaceTempView(upstream.name)
    return mv_key


def _normalised(frame: DataFrame, column: str) -> Column:
    """A column as it enters the checksum: floating values rounded so the tolerance holds."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, FloatType

    if isinstance(frame.schema[column].dataType, DoubleType | FloatType):
        return F.round(F.col(column), 6)
    return F.col(column)


def _bucketed(frame: DataFrame, key: list[str], columns: list[str], key_ranges: int) -> DataFrame:
    from pyspark.sql import functions as F

    return frame.select(
        F.pmod(F.xxhash64(*[F.col(c) for c in key]), F.lit(key_ranges)).alias(_BUCKET),
        F.xxhash64(*[_normalised(frame, c) for c in columns]).alias(_HASH),
    )


def _range_checksums(bucketed: DataFrame) -> dict[int, tuple[int, int]]:
    """Per key range: (rows, sum of row hashes), collected (at most `key_ranges` rows)."""
    from pyspark.sql import functions as F

    summary = bucketed.groupBy(_BUCKET).agg(
        F.count(F.lit(1)).alias("rows"), F.sum(F.col(_HASH).cast("decimal(38,0)")).alias("checksum")
    )
    return {row[_BUCKET]: (row["rows"], int(row["checksum"])) for row in summary.collect()}


def _differing_ranges(expected: dict[int, tuple[int, int]], actual: dict[int, tuple[int, int]]) -> list[int]:
    return sorted(bucket for bucket in set(expected) | set(actual) if expected.get(bucket) != actual.get(bucket))


def _close(left: Any, right: Any) -> bool:
    if isinstance(left, float) and isinstance(right, float):
        return abs(left - right) <= RELATIVE_TOLERANCE * max(1.0, abs(left), abs(right))
    return bool(left == right)


def first_differences(
    expected: DataFrame, actual: DataFrame, key: list[str], columns: list[str],
    key_ranges: int, ranges: list[int], show: int,
) -> list[Difference]:
    """The first `show` differing keys (in key order) inside the differing key ranges."""
    from pyspark.sql import functions as F

    def within(frame: DataFrame) -> DataFrame:
        bucket = F.pmod(F.xxhash64(*[F.col(c) for c in key]), F.lit(key_ranges))
        return frame.where(bucket.isin(ranges))

    values = [c for c in columns if c not in key]
    row_values = F.struct(*values) if values else F.lit(1)
    expected_side = within(expected).select(*key, row_values.alias("expected"))
    actual_side = within(actual).groupBy(*key).agg(
        F.count(F.lit(1)).alias("copies"), F.first(row_values).alias("actual")
    ).select(*[F.col(c).alias(f"__mv_{c}") for c in key], "copies", "actual")
    # null-safe on the key: an aggregate MV may have a group whose key is NULL
    condition = expected_side[key[0]].eqNullSafe(actual_side[f"__mv_{key[0]}"])
    for column in key[1:]:
        condition = condition & expected_side[column].eqNullSafe(actual_side[f"__mv_{column}"])
    joined = expected_side.join(actual_side, condition, "full_outer").select(
        *[F.coalesce(F.col(c), F.col(f"__mv_{c}")).alias(c) for c in key], "expected", "copies", "actual"
    )
    differences: list[Difference] = []
    # Rows that are certainly equal (same values, one copy) are filtered in Spark; the
    # tolerance for floating values is applied here, on the few candidates left.
    candidates = joined.where(
        F.col("expected").isNull() | F.col("actual").isNull() | (F.col("copies") != 1)
        | ~F.col("expected").eqNullSafe(F.col("actual"))
    ).orderBy(*key)
    for row in candidates.toLocalIterator():
        record = row.asDict(recursive=True)
        key_values = {c: record[c] for c in key}
        found, kept = record["expected"], record["actual"]
        if kept is None:
            differences.append(Difference(key_values, "missing", expected=found))
        elif found is None:
            differences.append(Difference(key_values, "extra", actual=kept))
        elif record["copies"] != 1:
            differences.append(Difference(key_values, "duplicate", expected=found, actual=kept))
        elif not all(_close(found[c], kept[c]) for c in values):
            differences.append(Difference(key_values, "changed", expected=found, actual=kept))
        if len(differences) >= show:
            break
    return differences
