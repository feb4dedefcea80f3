"""Start a phase's driver JVM on the class-data-sharing archive, when there is one.

See airflow_backfill/engine/launch/class_archive.py: the driver gets the archive's empty conf
folder, the settings file of the usual one as `--properties-file`, and the archive in its
Java options. A driver started on the cluster (deploy mode `cluster`) cannot see the
archive file and starts as before.
"""

from __future__ import annotations

import os

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from airflow_backfill.engine.launch.class_archive import DRIVER_JAVA_OPTIONS, archive_launch, archive_path
from airflow_backfill.hooks.spark_connection import driver_deploy_mode


def start_driver_on_archive(operator: SparkSubmitOperator, conn_id: str) -> None:
    """Set the operator's environment, properties file and driver options for the archive."""
    if driver_deploy_mode(conn_id, getattr(operator, "_deploy_mode", None)) == "cluster":
        return
    launch = archive_launch(properties_file=operator.properties_file)
    if launch is None:
        path = archive_path()
        if path is not None and not os.path.exists(path):
            operator.log.info("no JVM class archive at %s: the driver starts without it. `airflow-backfill "
                              "jvm-archive` builds it once (about a minute); each phase then starts seconds sooner",
                              path)
        return
    conf = dict(operator.conf or {})
    conf[DRIVER_JAVA_OPTIONS] = launch.driver_java_options(conf.get(DRIVER_JAVA_OPTIONS))
    operator.conf = conf
    operator.env_vars = {**(operator.env_vars or {}), **launch.environment()}
    operator.properties_file = launch.properties_file
    operator.log.info("the driver JVM starts on the class archive %s", launch.archive)
