"""Example: backfill, catch up and then maintain `orders_mv` over a live `orders` table.

Start the upstream first (it keeps committing epochs until stopped):

    airflow-backfill simulate --table "$AIRFLOW_BACKFILL_HOME/orders"

Tables live under $AIRFLOW_BACKFILL_HOME (default ~/airflow_backfill). The forward task
stops after `forward_max_epochs` epochs or `forward_idle_timeout` idle seconds, so that
`airflow dags test example_orders_mv` finishes; trigger with
`--conf '{"forward_max_epochs": null}'` to keep it running, or override
`backfill_parallelism`, `parallelism`, `rate_limit`, `lag_threshold` for one run.
The same job as a YAML file: jobs/orders_mv.yaml.

Tables on S3 (or an S3-compatible store): set AIRFLOW_BACKFILL_HOME=s3://bucket/prefix
and AIRFLOW_BACKFILL_AWS_CONN_ID to an Airflow connection of the `aws` type (keys,
region, `endpoint_url` in its extra for a non-AWS store); see docs/object_storage.md.
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG

from airflow_backfill.job import BackfillJob
from airflow_backfill.task_group import FORWARD_BOUNDS_FROM_PARAMS, backfill_task_group, forward_bound_params

# [START example_orders_mv_job]
ORDERS_MV = BackfillJob(
    name="orders_mv",
    source="${AIRFLOW_BACKFILL_HOME}/orders",
    target="${AIRFLOW_BACKFILL_HOME}/orders_mv",
    query=(
        "SELECT order_id, customer_id, status, amount * quantity AS total, updated_at "
        "FROM source WHERE status <> 'cancelled'"
    ),
    primary_key=("order_id",),
    backfill_parallelism=2,
    parallelism=1,
    lag_threshold=1,
    aws_conn_id=os.environ.get("AIRFLOW_BACKFILL_AWS_CONN_ID") or None,
)
# [END example_orders_mv_job]

# [START example_orders_mv_dag]
with DAG(
    dag_id="example_orders_mv",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    params=forward_bound_params(max_epochs=3, idle_timeout=30),
    tags=["airflow_backfill", "example"],
) as dag:
    backfill_task_group(ORDERS_MV, **FORWARD_BOUNDS_FROM_PARAMS)
# [END example_orders_mv_dag]
