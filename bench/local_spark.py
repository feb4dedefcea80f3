"""A plain local Spark session with Delta's jars, for the benchmark's own Spark work.

The users' Spark writer and the benchmark's after-run readers (change feeds) are
applications of their own, as a user's would be: Spark's defaults plus Delta, not the
engine's session settings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SMALL_JOBS = {
    "spark.sql.shuffle.partitions": "1",
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
}
"""Jobs of at most a few thousand rows: one shuffle partition, no UI."""


def delta_session(app_name: str, cores: int = 1, settings: dict[str, str] | None = None) -> SparkSession:
    from pyspark.sql import SparkSession

    from airflow_backfill.engine.delta.jars import delta_spark_conf

    builder = SparkSession.builder.master(f"local[{cores}]").appName(app_name)
    for key, value in {**delta_spark_conf(), **SMALL_JOBS, **(settings or {})}.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
