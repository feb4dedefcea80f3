"""Where the install-time Delta jars are, and the Spark settings that load them.

`scripts/fetch_jars.sh` fetches the pinned jars of `jars/pom.xml` with Maven into
`jars/lib` of the checkout; every Spark session and every `spark-submit` an operator
builds loads them through `spark.jars`, so nothing is resolved at run time. Hadoop's S3A
connector (`jars/s3/lib`, for s3a:// tables) goes on the driver's and executors' classpath
instead, so that executors do not copy its jars at start. Free of Spark imports: the
Airflow operators call it before `spark-submit`.
"""

from __future__ import annotations

import glob
import os

from airflow_backfill.engine.delta.commit_settings import commit_settings
from airflow_backfill.exceptions import BackfillConfigError

JARS_DIR_VARIABLE = "AIRFLOW_BACKFILL_JARS_DIR"
"""A folder of jars to load, or `provided` when the cluster already has Delta Lake."""
PROVIDED = "provided"
S3A_JARS_DIR_VARIABLE = "AIRFLOW_BACKFILL_S3A_JARS_DIR"
"""A folder of S3A jars (hadoop-aws and its AWS SDK modules), or `provided` when the
cluster already has S3A on its classpath."""
DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"


def default_jars_dir() -> str:
    """`jars/lib` next to the package (a checkout installed with scripts/install.sh)."""
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    return os.path.join(package_root, "jars", "lib")


def default_s3a_jars_dir() -> str:
    """`jars/s3/lib` next to the package: hadoop-aws and the AWS SDK modules it needs."""
    return os.path.join(os.path.dirname(default_jars_dir()), "s3", "lib")


def delta_jars() -> list[str]:
    """The jar files to put on `spark.jars` ([] when the cluster provides Delta itself)."""
    configured = os.environ.get(JARS_DIR_VARIABLE, "").strip()
    if configured == PROVIDED:
        return []
    directory = configured or default_jars_dir()
    jars = sorted(glob.glob(os.path.join(directory, "*.jar")))
    if not any(os.path.basename(jar).startswith("delta-spark_") for jar in jars):
        raise BackfillConfigError(
            f"no Delta Lake jars in {directory}: run scripts/install.sh (it fetches them with Maven), "
            f"or set {JARS_DIR_VARIABLE} to a folder holding delta-spark and its dependencies, or to "
            f"'{PROVIDED}' when the Spark cluster already has Delta Lake on its classpath."
        )
    return jars


def s3a_classpath_conf() -> dict[str, str]:
    """The driver's and executors' extra classpath for S3A ({} when jars/s3/lib is missing).

    A classpath glob, read by each JVM from its own disk: the folder must exist at the same
    path on every host that runs an executor.
    """
    directory = os.environ.get(S3A_JARS_DIR_VARIABLE, "").strip() or default_s3a_jars_dir()
    if directory == PROVIDED or not glob.glob(os.path.join(directory, "*.jar")):
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
