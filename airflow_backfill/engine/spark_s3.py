"""Hand the S3 settings to Spark's S3A connector inside the running driver.

Set on the session's Hadoop configuration at run time, not on the command line: Spark
copies that configuration into every job it ships to the executors, so the credentials
reach them without appearing in a process list or the Spark UI's command line.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from airflow_backfill.storage.s3_settings import S3Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


def configure_s3a(session: SparkSession, settings: S3Settings) -> None:
    """Point S3A (serving `s3://` and `s3a://`) at the store described by `settings`."""
    from airflow_backfill.engine.internals import hadoop_configuration

    hadoop = hadoop_configuration(session)
    for key, value in settings.hadoop_conf(with_secrets=True).items():
        hadoop.set(key, value)
    log.info("S3 settings for Spark: %r", settings)


def configure_s3a_from_environment(session: SparkSession) -> bool:
    """Apply the process's AWS_* settings when it was started with some; True if applied."""
    settings = S3Settings.from_environment()
    if not (settings.endpoint_url or settings.access_key_id):
        return False
    configure_s3a(session, settings)
    return True
