"""Example: read three MVs at one upstream epoch in a downstream task.

Two MVs over `orders` (`orders_mv`, stateless, built by example_orders_mv, and
`order_status_counts`, an aggregate) and one over `orders_mv` (`revenue_by_customer`,
MV-on-MV). Each keeps its own watermark, so their newest versions may reflect different
epochs of `orders` and their totals disagree. `example_order_summaries` builds the two
aggregates (after example_orders_mv built `orders_mv`); `example_consistent_reads` waits
until the three MVs share an epoch and reads them all at it:

    airflow-backfill simulate --table "$AIRFLOW_BACKFILL_HOME/orders" &
    airflow dags test example_orders_mv
    airflow dags test example_order_summaries
    airflow dags test example_consistent_reads

Tables live under $AIRFLOW_BACKFILL_HOME (default ~/airflow_backfill). See
docs/consistent-reads.md.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import pendulum
from airflow.sdk import DAG, Param, task

from airflow_backfill.job import BackfillJob
from airflow_backfill.sensors.consistent import ConsistentVersionsSensor
from airflow_backfill.task_group import FORWARD_BOUNDS_FROM_PARAMS, backfill_task_group, forward_bound_params

log = logging.getLogger(__name__)

# [START example_consistent_reads_jobs]
ORDERS_MV = BackfillJob(  # the same job as dags/example_orders_mv.py and jobs/orders_mv.yaml
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

ORDER_STATUS_COUNTS = BackfillJob(
    name="order_status_counts",
    source="${AIRFLOW_BACKFILL_HOME}/orders",
    target="${AIRFLOW_BACKFILL_HOME}/order_status_counts",
    query="SELECT status, COUNT(*) AS orders, SUM(amount * quantity) AS total FROM source GROUP BY status",
    primary_key=("order_id",),
    lag_threshold=1,
)

REVENUE_BY_CUSTOMER = BackfillJob(  # an MV over orders_mv
    name="revenue_by_customer",
    source=ORDERS_MV.target,
    target="${AIRFLOW_BACKFILL_HOME}/revenue_by_customer",
    query="SELECT customer_id, COUNT(*) AS orders, SUM(total) AS revenue FROM source GROUP BY customer_id",
    primary_key=("order_id",),
    lag_threshold=1,
)
# [END example_consistent_reads_jobs]

with DAG(
    dag_id="example_order_summaries",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    params=forward_bound_params(max_epochs=3, idle_timeout=30),
    tags=["airflow_backfill", "example"],
):
    backfill_task_group(ORDER_STATUS_COUNTS, **FORWARD_BOUNDS_FROM_PARAMS)
    backfill_task_group(REVENUE_BY_CUSTOMER, **FORWARD_BOUNDS_FROM_PARAMS)


# [START example_consistent_reads_dag]
@task
def read_at_one_epoch(versions: dict[str, Any]) -> dict[str, Any]:
    """Read the three MVs at the versions the sensor found (delta-rs, no Spark): the orders
    and totals of `orders_mv` are those of its two aggregates at one epoch."""
    from airflow_backfill.engine.consistency.readers import read_arrow

    orders_mv = read_arrow(versions, "orders_mv", "SELECT COUNT(*) AS orders, SUM(total) AS total FROM t")
    by_customer = read_arrow(versions, "revenue_by_customer",
                             "SELECT SUM(orders) AS orders, SUM(revenue) AS total FROM t")
    by_status = read_arrow(versions, "order_status_counts",
                           "SELECT SUM(orders) AS orders, SUM(total) AS total FROM t WHERE status <> 'cancelled'")
    totals = {name: {"orders": rows["orders"][0].as_py() or 0, "total": rows["total"][0].as_py() or 0.0}
              for name, rows in (("orders_mv", orders_mv), ("revenue_by_customer", by_customer),
                                 ("order_status_counts", by_status))}
    log.info("read at %s: %s", versions["epochs"], totals)
    first = totals["orders_mv"]
    if any(entry["orders"] != first["orders"] or not math.isclose(entry["total"], first["total"], rel_tol=1e-9)
           for entry in totals.values()):
        raise ValueError(f"the MVs disagree at {versions['epochs']}: {totals}")
    return {"epochs": versions["epochs"], **first}


with DAG(
    dag_id="example_consistent_reads",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    params={"min_epochs": Param(None, type=["null", "integer", "string"],
                                description="read no older than this epoch of orders (null: any)")},
    tags=["airflow_backfill", "example"],
):
    versions = ConsistentVersionsSensor(
        task_id="wait_for_one_epoch",
        tables=[ORDERS_MV, ORDER_STATUS_COUNTS, REVENUE_BY_CUSTOMER],
        min_epochs="{{ params.min_epochs }}",
        poke_interval=5,
        trigger_poll_interval=5,
        timeout=3600,
    )
    read_at_one_epoch(versions.output)
# [END example_consistent_reads_dag]
