"""Example: TPC-H Q3's revenue per order, a join of three upstreams with an aggregate on top.

The MV reads `customer`, `orders` and `lineitem` (`sources`), each at its own version:
its watermark is a vector, one version per upstream (docs/joins.md). Load the upstreams
and keep refreshing `orders` and `lineitem` first (RF1 inserts orders with their line
items, RF2 deletes some):

    python -m airflow_backfill.tpch load --root "$AIRFLOW_BACKFILL_HOME/tpch" --scale-factor 0.01
    python -m airflow_backfill.tpch rf1 --root "$AIRFLOW_BACKFILL_HOME/tpch" --repeat 5
    python -m airflow_backfill.tpch rf2 --root "$AIRFLOW_BACKFILL_HOME/tpch" --repeat 5

Then `airflow dags test example_tpch_q3`. The same job as a YAML file: jobs/tpch_q3.yaml.
Tables live under $AIRFLOW_BACKFILL_HOME (default ~/airflow_backfill).
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_backfill.job import BackfillJob
from airflow_backfill.task_group import FORWARD_BOUNDS_FROM_PARAMS, backfill_task_group, forward_bound_params

# [START example_tpch_q3_job]
TPCH_Q3 = BackfillJob(
    name="tpch_q3",
    sources={
        "customer": {"table": "${AIRFLOW_BACKFILL_HOME}/tpch/customer", "primary_key": ["c_custkey"]},
        "orders": {"table": "${AIRFLOW_BACKFILL_HOME}/tpch/orders", "primary_key": ["o_orderkey"]},
        "lineitem": {"table": "${AIRFLOW_BACKFILL_HOME}/tpch/lineitem", "primary_key": ["l_orderkey", "l_linenumber"]},
    },
    target="${AIRFLOW_BACKFILL_HOME}/tpch/q3",
    query="""
        SELECT l_orderkey,
               SUM(l_extendedprice * (1 - l_discount)) AS revenue,
               o_orderdate,
               o_shippriority
        FROM customer, orders, lineitem
        WHERE c_mktsegment = 'BUILDING'
          AND c_custkey = o_custkey
          AND l_orderkey = o_orderkey
          AND o_orderdate < DATE '1995-03-15'
          AND l_shipdate > DATE '1995-03-15'
        GROUP BY l_orderkey, o_orderdate, o_shippriority
    """,
    backfill_parallelism=2,
    parallelism=1,
    lag_threshold=1,
)
# [END example_tpch_q3_job]

# [START example_tpch_q3_dag]
with DAG(
    dag_id="example_tpch_q3",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    params=forward_bound_params(max_epochs=2, idle_timeout=20),
    tags=["airflow_backfill", "example", "tpch", "join"],
) as dag:
    backfill_task_group(TPCH_Q3, group_id="q3", **FORWARD_BOUNDS_FROM_PARAMS)
# [END example_tpch_q3_dag]
