"""Hand the provider's settings, as this task resolved them, to the spark-submit it starts.

A phase's driver reads the same settings (the jars' folders, the size thresholds, the lease)
but does not load Airflow's configuration (a second of start-up per phase): what
`[airflow_backfill]` sets in `airflow.cfg` or `AIRFLOW__AIRFLOW_BACKFILL__*` reaches it as
`AIRFLOW_BACKFILL_*` variables. The operator's own `env_vars` win.
"""

from __future__ import annotations

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from airflow_backfill.config import settings_environment


def hand_settings_to_driver(operator: SparkSubmitOperator) -> None:
    """Add the settings that differ from their defaults to the operator's environment."""
    operator.env_vars = {**settings_environment(), **(operator.env_vars or {})}
