"""Build the SparkSession a phase runs in, at the phase's parallelism."""

from __future__ import annotations

import logging
import os
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from airflow_backfill.engine.delta.arrow_types import TIME_ZONE
from airflow_backfill.engine.delta.jars import delta_spark_conf
from airflow_backfill.engine.internals import (
    missing_class,
    pin_pyspark_classes,
    quiet_loggers,
    set_default_time_zone,
)
from airflow_backfill.engine.launch.class_archive import DRIVER_JAVA_OPTIONS, archive_launch
from airflow_backfill.engine.parallelism import spark_conf_for, task_conf_for
from airflow_backfill.engine.sizes import sizes
from airflow_backfill.engine.spark_s3 import configure_s3a_from_environment
from airflow_backfill.exceptions import BackfillConfigError

if TYPE_CHECKING:
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

DELTA_CLASS = "io.delta.tables.DeltaTable"
QUIET_LOGGERS = ("org.apache.spark.sql.delta.DeltaHistoryManager", "org.apache.spark.sql.catalyst.util.StringUtils")
"""Loggers set to ERROR in every engine session. DeltaHistoryManager warns "Found Delta
commit N with a timestamp ... greater than the next commit timestamp" whenever a commit's
log file is not younger than the one before, which S3's one-second `LastModified` makes
of any two commits within a second, dozens of times per task; Delta corrects the times
itself, and the engine addresses tables by version only (docs/object_storage.md).
StringUtils warns at every plan of a join round that its text was truncated, as
`spark.sql.maxPlanStringLength` below asks."""
SUBMIT_ARGS_VARIABLE = "PYSPARK_SUBMIT_ARGS"
EXECUTOR_JAVA_OPTIONS = "spark.executor.extraJavaOptions"
DEFAULT_MASTER = "local[*]"
"""The master when neither spark-submit nor the environment sets one (tests, notebooks)."""


def spark_conf_for_parallelism(parallelism: int) -> dict[str, str]:
    """Master-independent settings for `parallelism` (shuffle and default parallelism).

    Kept for callers that do not know the master yet; `spark_conf_for(parallelism,
    master)` in engine/parallelism.py also sizes local[N] or the executors.
    """
    return task_conf_for(parallelism)


def _submitted_executor_cores(value: str | None) -> int | None:
    """spark.executor.cores as spark-submit passed it (None when unset or not a number)."""
    if value is None or not value.strip().isdigit():
        return None
    return int(value)


def build_spark_session(app_name: str, parallelism: int) -> SparkSession:
    """A session at `parallelism`, mapped by `spark_conf_for` onto the submitted master.

    spark-submit passes its own master: a local one becomes `local[N]`; a cluster one is
    kept and gets executors x cores (or dynamic-allocation bounds, when the cluster
    enables it) plus N shuffle partitions. Timestamps are written as microseconds and
    read in UTC so that files are readable by delta-rs and comparable across engines.
    """
    from pyspark.sql import SparkSession

    submitted = _submitted_conf()
    master = submitted.get("spark.master", DEFAULT_MASTER) or DEFAULT_MASTER
    dynamic = (submitted.get("spark.dynamicAllocation.enabled", "false") or "").lower() == "true"
    parallelism_conf = spark_conf_for(
        parallelism, master,
        executor_cores=_submitted_executor_cores(submitted.get("spark.executor.cores", None)),
        dynamic_allocation=dynamic,
    )
    master = parallelism_conf.pop("spark.master", master)
    builder = SparkSession.builder.appName(app_name).master(master)
    settings = {
        **delta_spark_conf(),
        **parallelism_conf,
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.sql.session.timeZone": TIME_ZONE,
        EXECUTOR_JAVA_OPTIONS: _in_utc_options(submitted.get(EXECUTOR_JAVA_OPTIONS, None)),
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.ui.showConsoleProgress": "false",
        # Delta rebuilds a table's state (its file list) with a Spark job after each commit;
        # the default of 50 tasks is pure overhead for logs of this size.
        "spark.databricks.delta.snapshotPartitions": str(parallelism),
        # On a host whose default time zone is not UTC, Delta checks the file list it keeps
        # in each commit's checksum by rebuilding the table's state after every commit (a
        # Spark job per commit); the engine reads and writes in UTC, which that check is for.
        "spark.databricks.delta.allFilesInCrc.verificationMode.forceOnNonUTC.enabled": "false",
        # Delta lists a version's files in its checksum only below 50 files; the engine reads,
        # overwrites, replaces and deletes from that list without rebuilding the table's state
        # (a one-key delete from a table of 120 files: 0.66 s listed, 1.95 s not). An MV gains
        # files with every round, so it would lose the list before maintenance compacts it.
        "spark.databricks.delta.allFilesInCrc.thresholdNumFiles": str(sizes().listed_files),
        # Adaptive execution renders the whole plan as text each time it re-plans; a join
        # round's plan (cached intermediates nest their own plans) reached hundreds of MiB
        # and exhausted the driver's heap. A truncated string only shortens the SQL UI.
        "spark.sql.maxPlanStringLength": "200000",
        # PySpark records the Python call site of every Column and DataFrame call in the
        # JVM (for its errors' "DataFrame query context"): eight calls over py4j around each
        # one, which made most of a shared-forward round's calls.
        "spark.python.sql.dataFrameDebugging.enabled": "false",
    }
    for key, value in settings.items():
        builder = builder.config(key, value)
    with _launched_on_archive(builder, submitted):
        session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    pin_pyspark_classes(session)
    _in_utc(session)
    quiet_loggers(session, QUIET_LOGGERS)
    _require_delta(session)
    configure_s3a_from_environment(session)
    log.info("spark session master=%s parallelism=%s", master, parallelism)
    return session


def _submitted_conf() -> SparkConf:
    """The settings spark-submit launched this driver with (its master, executor cores...).

    Under spark-submit they live in the JVM that started this process; a SparkConf only
    sees them once the gateway to that JVM is open. Outside spark-submit (tests, notebooks)
    no JVM is started here: the session's own settings, jars included, must reach the JVM
    when it launches.
    """
    from pyspark import SparkConf, SparkContext

    if "PYSPARK_GATEWAY_PORT" in os.environ:
        SparkContext._ensure_initialized()  # type: ignore[attr-defined]
    return SparkConf()


@contextmanager
def _launched_on_archive(builder: SparkSession.Builder, submitted: SparkConf) -> Iterator[None]:
    """Start a JVM this process launches itself (the CLI, notebooks, tests; not a phase under
    spark-submit, whose JVM runs already) on the JVM class archive, as the operators start
    the phases' drivers (engine/launch/class_archive.py).

    pyspark launches `spark-submit pyspark-shell` with this process's environment, so the
    archive's conf folder and the properties file are set in it for the launch only.
    """
    launch_args = os.environ.get(SUBMIT_ARGS_VARIABLE, "pyspark-shell")
    launch = None
    if "PYSPARK_GATEWAY_PORT" not in os.environ and "--properties-file" not in launch_args:
        launch = archive_launch()
    if launch is None:
        yield
        return
    builder.config(DRIVER_JAVA_OPTIONS, launch.driver_java_options(submitted.get(DRIVER_JAVA_OPTIONS, None)))
    saved = {name: os.environ.get(name) for name in ("SPARK_CONF_DIR", SUBMIT_ARGS_VARIABLE)}
    os.environ.update(launch.environment())
    if launch.properties_file:
        os.environ[SUBMIT_ARGS_VARIABLE] = f"--properties-file {shlex.quote(launch.properties_file)} {launch_args}"
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _in_utc_options(options: str | None) -> str:
    """Java options that start a JVM in UTC (`_in_utc`), added to `options`."""
    words = shlex.split(options or "")
    if any(word.startswith("-Duser.timezone=") for word in words):
        words = [word for word in words if not word.startswith("-Duser.timezone=")]
    return " ".join([*words, f"-Duser.timezone={TIME_ZONE}"])


def _in_utc(session: SparkSession) -> None:
    """Run the driver JVM in UTC, whatever the host's zone (executors get it at launch,
    `spark.executor.extraJavaOptions`). Delta 4.4's change-feed reader shifts timestamps
    before 1900 by the JVM's default zone (its local mean time, 3 min 58 s in New York),
    where its table reader does not; tests/test_differential.py found it."""
    before = set_default_time_zone(session, TIME_ZONE)
    if before != TIME_ZONE:
        log.info("driver JVM moved from the default time zone %s to %s", before, TIME_ZONE)


def _require_delta(session: SparkSession) -> None:
    """Fail with the fix when the driver cannot load Delta Lake's classes.

    Under spark-submit the driver's classpath is fixed at launch, so jars set while the
    session is built reach the executors but not the driver. Only the JVM's answer that the
    class is missing means that; any other failure (the gateway to the JVM lost, say) is
    raised as it is.
    """
    missing = missing_class(session, DELTA_CLASS)  # another failure of the JVM is raised as it is
    if missing is not None:
        raise BackfillConfigError(
            "Delta Lake's Spark connector is not on this Spark driver's classpath. Give spark-submit the "
            "Delta settings at launch: the phase operators do; by hand, `source scripts/env.sh` (its "
            "SPARK_CONF_DIR holds them) or pass `--properties-file jars/conf/spark-defaults.conf`. "
            f"(The JVM: {missing})"
        )
