"""Where the Delta jars are, and the Spark settings that load them.

`airflow-backfill jars fetch` resolves the pinned Maven coordinates (`airflow_backfill/jvm/`)
once into the provider's cache, or the `[airflow_backfill] jars_dir` option names another
folder; every Spark session and every `spark-submit` an operator builds loads them through
`spark.jars`, so nothing is resolved at run time. Hadoop's S3A connector (for s3a:// tables)
goes on the driver's and executors' classpath instead, so that executors do not copy its
jars at start. Free of Spark imports: the Airflow operators call it before `spark-submit`.
"""

from __future__ import annotations

import glob
import os

from airflow_backfill.engine.delta.commit_settings import commit_settings
from airflow_backfill.exceptions import BackfillConfigError
from airflow_backfill.jvm.libraries import S3A, SPARK, local_fs_jar

DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"


def delta_jars() -> list[str]:
    """The jar files to put on `spark.jars`: the fetched set and the project's own jar when
    the wheel carries it ([] when the cluster provides Delta itself)."""
    if SPARK.folder() is None:
        return []
    jars = SPARK.jars()
    if not any(os.path.basename(jar).startswith("delta-spark_") for jar in jars):
        raise BackfillConfigError(SPARK.missing_message())
    own = local_fs_jar()
    return [*jars, own] if own else jars


def s3a_classpath_conf() -> dict[str, str]:
    """The driver's and executors' extra classpath for S3A ({} when its jars were not fetched).

    A classpath glob, read by each JVM from its own disk: the folder must exist at the same
    path on every host that runs an executor.
    """
    directory = S3A.folder()
    if directory is None or not glob.glob(os.path.join(directory, "*.jar")):
        return {}
    classpath = os.path.join(directory, "*")
    return {"spark.driver.extraClassPath": classpath, "spark.executor.extraClassPath": classpath}


def delta_spark_conf() -> dict[str, str]:
    """Spark settings for Delta Lake: the jars (when not provided), its SQL extension and
    catalog, the S3A classpath (when installed) and the settings that keep its commits on
    local tables from starting processes (`commit_settings`)."""
    jars = delta_jars()
    conf = {"spark.sql.extensions": DELTA_EXTENSION, "spark.sql.catalog.spark_catalog": DELTA_CATALOG,
            **commit_settings(jars)}
    if jars:
        conf["spark.jars"] = ",".join(jars)
    conf.update(s3a_classpath_conf())
    return conf
