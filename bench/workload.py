"""What the benchmark runs: the MV queries over TPC-H lineitem, their jobs, the plain
Spark baseline, and the freshness latencies read back from the two Delta logs."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_backfill import tpch

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_backfill.job import BackfillJob

STATELESS_QUERY = (
    "SELECT l_orderkey, l_linenumber, l_extendedprice * (1 - l_discount) AS disc_price, l_shipdate "
    "FROM source WHERE l_shipdate <= DATE '1998-09-02'"
)
"""A stateless MV: one row per line item shipped by the TPC-H Q1 cut-off date."""

Q1_QUERY = (
    "SELECT l_returnflag, l_linestatus, SUM(l_quantity) AS sum_qty, "
    "SUM(l_extendedprice) AS sum_base_price, SUM(l_extendedprice * (1 - l_discount)) AS sum_disc_price, "
    "SUM(l_extendedprice * (1 - l_discount) * (1 + l_tax)) AS sum_charge, AVG(l_quantity) AS avg_qty, "
    "AVG(l_extendedprice) AS avg_price, AVG(l_discount) AS avg_disc, COUNT(*) AS count_order "
    "FROM source WHERE l_shipdate <= DATE '1998-09-02' GROUP BY l_returnflag, l_linestatus"
)
"""TPC-H Q1 (without ORDER BY, which an MV has no use for) as an aggregate MV."""

QUERIES = {"stateless": STATELESS_QUERY, "aggregate": Q1_QUERY}
LINEITEM_KEY = tpch.PRIMARY_KEYS[tpch.LINEITEM]
LOADED_EPOCH = 0
"""Snapshot measurements pin the initial load, so later sections' writes never change them."""


@dataclass(frozen=True)
class Workspace:
    """The benchmark's folders: TPC-H upstreams, MVs and scratch output."""

    root: str

    @property
    def tables(self) -> tpch.TpchTables:
        return tpch.open_tpch(self.upstream_root)

    @property
    def upstream_root(self) -> str:
        return os.path.join(self.root, "tpch")

    @property
    def warm_up_tables(self) -> tpch.TpchTables:
        """A small copy of TPC-H for warm-up runs, which only need to touch the code paths."""
        return tpch.open_tpch(self.warm_up_root)

    @property
    def warm_up_root(self) -> str:
        return os.path.join(self.root, "tpch-warm-up")

    def scratch(self, name: str) -> str:
        """A fresh, empty folder path (removed first if a previous run left it)."""
        path = os.path.join(self.root, "scratch", name)
        shutil.rmtree(path, ignore_errors=True)
        return path


def query_support(kind: str) -> str | None:
    """None when the engine accepts the query kind, else why not (said in the report)."""
    from airflow_backfill.engine.planning.query import plan_query
    from airflow_backfill.exceptions import BackfillConfigError

    try:
        plan_query(QUERIES[kind], LINEITEM_KEY)
    except BackfillConfigError as error:
        return f"not supported yet: {error}"
    return None


WARM_UP_SCALE_FACTOR = 0.01


def lineitem_job(
    workspace: Workspace, name: str, target: str, query: str, *, warm_up: bool = False, **settings: Any
) -> BackfillJob:
    from airflow_backfill.job import BackfillJob

    tables = workspace.warm_up_tables if warm_up else workspace.tables
    return BackfillJob(
        name=name, source=tables.lineitem, target=target, query=query,
        primary_key=LINEITEM_KEY, **settings,
    )


def upstream_files(source: str, epoch: int) -> list[str]:
    """The upstream's data files at `epoch`: what both the engine and the baseline read."""
    from airflow_backfill.engine.snapshot_chunks.plan import list_data_files

    return [file.path for file in list_data_files(source, epoch)]


def plain_spark_job(spark: SparkSession, files: list[str], query: str, out_dir: str) -> None:
    """The baseline: read the Parquet files, run the query, write Parquet. No Delta at all."""
    spark.read.parquet(*files).createOrReplaceTempView("source")
    spark.sql(query).write.parquet(out_dir)


def plain_recompute(spark: SparkSession, source: str, version: int, query: str, target: str) -> None:
    """The baseline of every catch-up figure: what a user would run instead of catching up.
    Read the upstream as of the version, run the query, overwrite a Delta table; no key
    proof, no chunks, no watermark."""
    plain_recompute_over(spark, {"source": (source, version)}, query, target)


def plain_recompute_over(spark: SparkSession, tables: dict[str, tuple[str, int]], query: str, target: str) -> None:
    """`plain_recompute` of a query over several tables (a join's upstreams), each read as
    of its own version under the name the query gives it."""
    for name, (uri, version) in tables.items():
        spark.read.format("delta").option("versionAsOf", version).load(uri).createOrReplaceTempView(name)
    spark.sql(query).write.format("delta").mode("overwrite").save(target)


def freshness_latencies(
    upstream_history: list[dict[str, Any]], mv_history: list[dict[str, Any]], versions: list[int]
) -> list[float]:
    """Seconds from each upstream commit in `versions` to the first MV commit reflecting it.

    An MV commit reflects upstream version `v` when its recorded epoch (the watermark it
    committed) is at least `v`. Versions no MV commit reflects yet are left out.
    """
    from airflow_backfill.engine.delta.log import commit_metadata

    committed = {int(entry["version"]): int(entry["timestamp"]) for entry in upstream_history}
    mv_commits = sorted(
        (int(metadata["epoch"]), int(entry["timestamp"]))
        for entry in mv_history
        if "epoch" in (metadata := commit_metadata(entry)) and "phase" in metadata
    )
    latencies = []
    for version in versions:
        reflecting = [timestamp for epoch, timestamp in mv_commits if epoch >= version]
        if version in committed and reflecting:
            latencies.append((min(reflecting) - committed[version]) / 1000.0)
    return latencies
