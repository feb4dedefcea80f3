"""Example: backfill, catch up and then maintain `orders_mv` over a live `orders` table.

Start the upstream first (it keeps committing epochs until stopped):

    airflow-backfill simulate --table "$AIRFLOW_BACKFILL_HOME/orders"

Tables live under $AIRFLOW_BACKFILL_HOME (default ~/airflow_backfill). The forward task
stops after `forward_max_epochs` epochs or `forward_idle_timeout` idle seconds, so that
`airflow dags test example_orders_mv` finishes; trigger with
`--conf '{"forward_max_epochs": null}'` to keep it running, or override
`backfill_parallelism`, `parallelism`, `rate_limit`, `lag_threshold` for one run.
The same job as a YAML file: jobs/orders_mv.yaml.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, Param

from airflow_backfill.job import BackfillJob
from airflow_backfill.task_group import backfill_task_group

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
)
# [END example_orders_mv_job]

# [START example_orders_mv_dag]
with DAG(
    dag_id="example_orders_mv",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    params={
        "forward_max_epochs": Param(3, type=["null", "integer"], minimum=1),
        "forward_idle_timeout": Param(30, type=["null", "number"], exclusiveMinimum=0),
    },
    tags=["airflow_backfill", "example"],
) as dag:
    backfill_task_group(
        ORDERS_MV,
        forward_max_epochs="{{ params.forward_max_epochs }}",
        forward_idle_timeout="{{ params.forward_idle_timeout }}",
    )
# [END example_orders_mv_dag]
