"""Example: a TPC-H Q1-style pricing summary over `lineitem`, and an MV built on it.

`pricing_summary` groups the line items by return flag and line status (TPC-H Q1);
`linestatus_totals` is an MV whose upstream is `pricing_summary` itself (MV-on-MV): it
reads the first MV's change feed, and its backfill starts as soon as the summary is
caught up, while the summary's forward phase keeps it fresh. Load the upstream and keep
refreshing it first:

    python -m airflow_backfill.tpch load --root "$AIRFLOW_BACKFILL_HOME/tpch" --scale-factor 0.01
    python -m airflow_backfill.tpch rf1 --root "$AIRFLOW_BACKFILL_HOME/tpch" --repeat 5   # RF1
    python -m airflow_backfill.tpch rf2 --root "$AIRFLOW_BACKFILL_HOME/tpch" --repeat 5   # RF2

Each MV is an Airflow Asset (`mv_asset(job)`): a DAG in another file can use
`schedule=[mv_asset(PRICING_SUMMARY)]` to run whenever the summary changes.
Tables live under $AIRFLOW_BACKFILL_HOME (default ~/airflow_backfill).
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_backfill.job import BackfillJob
from airflow_backfill.task_group import (
    FORWARD_BOUNDS_FROM_PARAMS,
    backfill_task_group,
    caught_up,
    forward_bound_params,
)

# [START example_tpch_jobs]
PRICING_SUMMARY = BackfillJob(
    name="tpch_pricing_summary",
    source="${AIRFLOW_BACKFILL_HOME}/tpch/lineitem",
    target="${AIRFLOW_BACKFILL_HOME}/tpch/pricing_summary",
    query="""
        SELECT l_returnflag, l_linestatus,
               SUM(l_quantity) AS sum_qty,
               SUM(l_extendedprice) AS sum_base_price,
               SUM(l_extendedprice * (1 - l_discount)) AS sum_disc_price,
               SUM(l_extendedprice * (1 - l_discount) * (1 + l_tax)) AS sum_charge,
               AVG(l_quantity) AS avg_qty,
               AVG(l_extendedprice) AS avg_price,
               AVG(l_discount) AS avg_disc,
               COUNT(*) AS count_order
        FROM source
        WHERE l_shipdate <= DATE '1998-09-02'
        GROUP BY l_returnflag, l_linestatus
    """,
    primary_key=("l_orderkey", "l_linenumber"),
    backfill_parallelism=2,
    parallelism=1,
    lag_threshold=1,
)

LINESTATUS_TOTALS = BackfillJob(
    name="tpch_linestatus_totals",
    source=PRICING_SUMMARY.target,
    target="${AIRFLOW_BACKFILL_HOME}/tpch/linestatus_totals",
    query="""
        SELECT l_linestatus,
               SUM(count_order) AS line_items,
               SUM(sum_charge) AS charge,
               MAX(avg_price) AS highest_avg_price,
               COUNT(*) AS return_flags
        FROM source
        GROUP BY l_linestatus
    """,
    primary_key=("l_returnflag", "l_linestatus"),
    backfill_parallelism=2,
    parallelism=1,
    lag_threshold=1,
)
# [END example_tpch_jobs]

# [START example_tpch_dag]
with DAG(
    dag_id="example_tpch_pricing_summary",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    params=forward_bound_params(max_epochs=2, idle_timeout=20),
    tags=["airflow_backfill", "example", "tpch"],
) as dag:
    summary = backfill_task_group(PRICING_SUMMARY, group_id="pricing_summary", **FORWARD_BOUNDS_FROM_PARAMS)
    totals = backfill_task_group(LINESTATUS_TOTALS, group_id="linestatus_totals", **FORWARD_BOUNDS_FROM_PARAMS)
    caught_up(summary) >> totals  # the summary's forward keeps running meanwhile
# [END example_tpch_dag]
