"""Spark's own answer for an MV version: its query over the upstreams as of the versions
the MV's commit records, compared with the MV's rows value for value.

The comparison is exact: every row becomes text Spark writes the same way for the same
values (JSON, with microsecond timestamps, NaN, infinities and -0.0 as themselves, maps at
any depth as their entries sorted), and the two sides must be equal as multisets, with the
same column names and types (tests/test_spark_oracle.py shows it failing). Used by the differential
harness (tests/test_differential.py), whose engine ran under another time zone: this
process reads what it committed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import reduce
from typing import TYPE_CHECKING

from deltalake import DeltaTable

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType

WATERMARKS = "airflow_backfill.watermarks"
JSON_OPTIONS = {"timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX",
                "timestampNTZFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS", "dateFormat": "yyyy-MM-dd"}
SHOWN = 5


@dataclass(frozen=True)
class MvVersion:
    version: int
    upstream_versions: dict[str, int]
    """The version of each upstream the MV version reflects, by the name its query reads."""


def mv_versions(target: str, app_id: str, upstreams: Mapping[str, str]) -> list[MvVersion]:
    """Every version of the MV from its first watermark on, with the upstream versions it
    reflects: the app transaction for one upstream, the commit's vector for a join (the
    newest commit at or before the version that carries one). Fails when a version has
    none, or when a watermark moves backwards."""
    history = {entry["version"]: json.loads(entry.get("userMetadata") or "{}")
               for entry in DeltaTable(target).history()}
    latest = max(history)
    found: list[MvVersion] = []
    vector: dict[str, int] | None = None
    for version in range(latest + 1):
        if WATERMARKS in history.get(version, {}):
            vector = {name: int(v) for name, v in json.loads(history[version][WATERMARKS]).items()}
        watermark = DeltaTable(target, version=version).transaction_version(app_id)
        if watermark is None:
            assert not found, f"{target} version {version} has no watermark after version {found[-1].version}"
            continue
        if len(upstreams) > 1:
            assert vector is not None and sum(vector.values()) == watermark, (target, version, vector, watermark)
            versions = dict(vector)
        else:
            versions = {next(iter(upstreams)): int(watermark)}
        if found:
            before = found[-1].upstream_versions
            assert all(versions[name] >= before[name] for name in versions), (target, version, before, versions)
        found.append(MvVersion(version, versions))
    return found


class VersionReads:
    """Each table version read once: Delta rebuilds a version's state (three Spark jobs)
    for every new read of it, and the MVs of one run read the same upstream versions, and
    an MV over an MV reads the versions checked for the MV below it."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self.read: dict[tuple[str, int], DataFrame] = {}

    def __call__(self, uri: str, version: int) -> DataFrame:
        if (uri, version) not in self.read:
            self.read[uri, version] = self.spark.read.format("delta").option("versionAsOf", version).load(uri)
        return self.read[uri, version]


def recomputed(spark: SparkSession, query: str, upstreams: Mapping[str, str], versions: Mapping[str, int],
               reads: VersionReads | None = None) -> DataFrame:
    """The query over each upstream as of its version (bound under the name the query reads)."""
    reads = reads or VersionReads(spark)
    for name, uri in upstreams.items():
        reads(uri, versions[name]).createOrReplaceTempView(name)
    return spark.sql(query)  # analysed now: replacing the views later changes nothing


def holds_map(kind: DataType) -> bool:
    from pyspark.sql.types import ArrayType, MapType, StructType

    if isinstance(kind, MapType):
        return True
    if isinstance(kind, ArrayType):
        return holds_map(kind.elementType)
    if isinstance(kind, StructType):
        return any(holds_map(field.dataType) for field in kind.fields)
    return False


def ordered_maps(column: Column, kind: DataType) -> Column:
    """`column` with every map in it, at any depth, as its entries sorted: Spark keeps a
    map's entries in the order they were built, which equal maps need not share. Columns
    without a map are left as they are, so a NULL struct stays NULL."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, MapType, StructType

    if not holds_map(kind):
        return column
    if isinstance(kind, MapType):  # a map's keys hold no map (Spark refuses such keys)
        entries = F.transform(F.map_entries(column), lambda entry: F.struct(
            entry["key"].alias("key"), ordered_maps(entry["value"], kind.valueType).alias("value")))
        return F.array_sort(entries)
    if isinstance(kind, ArrayType):  # an array's order is its value: only its elements change
        return F.transform(column, lambda element: ordered_maps(element, kind.elementType))
    assert isinstance(kind, StructType)
    fields = [ordered_maps(column[field.name], field.dataType).alias(field.name) for field in kind.fields]
    return F.when(column.isNull(), F.lit(None)).otherwise(F.struct(*fields))


def canonical(frame: DataFrame) -> DataFrame:
    """The row as one text (column `__row`), equal exactly when every value is."""
    from pyspark.sql import functions as F

    row = F.struct(*(ordered_maps(F.col(f"`{field.name}`"), field.dataType).alias(field.name)
                     for field in frame.schema.fields))
    return frame.select(F.to_json(row, JSON_OPTIONS).alias("__row"))


def differences(spark: SparkSession, target: str, app_id: str, query: str, upstreams: Mapping[str, str],
                reads: VersionReads | None = None) -> tuple[list[str], int]:
    """What differs between each MV version and Spark's recompute at its upstream versions
    (empty: every version equals it), and how many versions were compared. All versions
    are compared in one Spark job (one per MV: a union of several MVs' plans takes longer
    to plan than it saves)."""
    from pyspark.sql import functions as F

    versions = mv_versions(target, app_id, upstreams)
    assert versions, f"{target} has no version with a watermark"
    reads = reads or VersionReads(spark)
    problems: list[str] = []
    parts = []
    for entry in versions:
        actual = reads(target, entry.version)
        expected = recomputed(spark, query, upstreams, entry.upstream_versions, reads)
        shape = [(f.name, f.dataType.simpleString()) for f in actual.schema.fields]
        wanted = [(f.name, f.dataType.simpleString()) for f in expected.schema.fields]
        if shape != wanted:
            problems.append(f"version {entry.version}: columns {shape}, Spark's query gives {wanted}")
            continue
        version = F.lit(entry.version).alias("__version")
        parts += [canonical(actual).select("*", version, F.lit(1).alias("__sign")),
                  canonical(expected).select("*", version, F.lit(-1).alias("__sign"))]
    if not parts:
        return problems, len(versions)
    # One pass: each side's rows counted with its sign, grouped by version and row; a row
    # whose counts do not cancel is in one side more often than in the other.
    signed = reduce(lambda a, b: a.unionByName(b), parts)
    unequal = (signed.groupBy("__version", "__row").agg(F.sum("__sign").alias("__surplus"))
               .where("__surplus <> 0").orderBy("__version").limit(2 * SHOWN).collect())
    for row in unequal:
        side = "in the MV, not in Spark's recompute" if row["__surplus"] > 0 else "in Spark's recompute, not in the MV"
        problems.append(f"version {row['__version']}, {side} ({abs(row['__surplus'])}x): {row['__row']}")
    return problems, len(versions)


def check_manifest(spark: SparkSession, manifest: Mapping) -> tuple[list[str], int]:
    """Every MV of a harness run's manifest (tests/differential_run.py) against Spark's
    recompute: (the differences found, the MV versions checked)."""
    problems, checked = [], 0
    reads = VersionReads(spark)
    for run in manifest["runs"]:
        for name, mv in run["mvs"].items():
            upstreams = mv["sources"] or {"source": mv["source"]}
            found, compared = differences(spark, mv["target"], mv["app_id"], mv["query"], upstreams, reads)
            problems += [f"{run['policy']} {name}: {problem}" for problem in found]
            checked += compared
    return problems, checked


def main(argv: list[str] | None = None) -> int:
    """`python tests/spark_oracle.py WORK`: check the MVs a harness run left in WORK."""
    import argparse
    import sys
    from pathlib import Path

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("work")
    args = parser.parse_args(argv)
    from airflow_backfill.engine.spark_session import build_spark_session

    spark = build_spark_session("spark_oracle", 2)
    try:
        problems, checked = check_manifest(spark, json.loads(Path(args.work, "manifest.json").read_text()))
    finally:
        spark.stop()
    print("\n".join(problems) or f"{checked} MV versions equal Spark's recompute", file=sys.stderr if problems else sys.stdout)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
