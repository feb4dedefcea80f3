"""Build the SparkSession a phase runs in, at the phase's parallelism."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


def spark_conf_for_parallelism(parallelism: int) -> dict[str, str]:
    """Spark settings that make a phase use `parallelism` slots for scans and shuffles."""
    return {
        "spark.sql.shuffle.partitions": str(parallelism),
        "spark.default.parallelism": str(parallelism),
    }


def build_spark_session(app_name: str, parallelism: int) -> SparkSession:
    """A session at `parallelism`: `local[N]` when the master is local (or unset).

    spark-submit passes its own master; on a cluster it is kept and only the shuffle
    and default parallelism follow the phase. Timestamps are written as microseconds and
    read in UTC so that files are readable by delta-rs and comparable across engines.
    """
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    submitted = SparkConf()
    master = submitted.get("spark.master", "local[*]")
    builder = SparkSession.builder.appName(app_name)
    if master.startswith("local"):
        master = f"local[{parallelism}]"
        builder = builder.master(master)
    settings = {
        **spark_conf_for_parallelism(parallelism),
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.ui.showConsoleProgress": "false",
    }
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    log.info("spark session master=%s parallelism=%s", master, parallelism)
    return session
