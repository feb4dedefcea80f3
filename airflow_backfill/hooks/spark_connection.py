"""The Spark connection the phase operators submit to, read through Airflow's public API.

Where the connection does not exist, the Spark provider silently falls back to
`--master yarn` and the task fails inside spark-submit with a message that says nothing
about what to configure. The phases therefore look the connection up first and fail
before spark-submit with the connection to create and an example value.
"""

from __future__ import annotations

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_backfill.exceptions import BackfillConfigError

EMBEDDED_SPARK_URI = "spark://local?deploy-mode=client"
"""The connection of embedded local Spark (`local[N]`, the driver in the Airflow worker)."""


def missing_connection_message(conn_id: str) -> str:
    """What to create when `conn_id` is missing: the variable or CLI command, with a value."""
    variable = f"AIRFLOW_CONN_{conn_id.upper()}"
    return (
        f"the Spark connection {conn_id!r} does not exist, so spark-submit would fall back to "
        f"'--master yarn'. Create it, for embedded local Spark: export {variable}='{EMBEDDED_SPARK_URI}' "
        f"(or: airflow connections add {conn_id} --conn-uri '{EMBEDDED_SPARK_URI}'); for a Spark "
        f"standalone cluster use 'spark://HOST:7077?deploy-mode=client'. Or pass conn_id= to the "
        "task group to use another connection."
    )


def spark_master(conn_id: str) -> str:
    """The master URL `conn_id` submits to (`local`, `spark://host:7077`, `yarn`, `k8s://...`).

    Mirrors how the Spark provider builds `--master` from a connection, so the phases can
    size executors for the same master without the provider's private attributes.
    """
    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        raise BackfillConfigError(missing_connection_message(conn_id)) from None
    host = conn.host or ""
    if conn.conn_type == "spark" and host and ("://" in host or not conn.port):
        master = host
    else:
        master = f"{conn.conn_type}://{host}"
    return f"{master}:{conn.port}" if conn.port else master


def driver_deploy_mode(conn_id: str, override: str | None = None) -> str:
    """`client` or `cluster`: where spark-submit starts the driver, as the Spark provider
    decides it (the operator's `deploy_mode`, else the connection's `deploy-mode` extra)."""
    if override:
        return override
    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        raise BackfillConfigError(missing_connection_message(conn_id)) from None
    return str(conn.extra_dejson.get("deploy-mode") or "client")
