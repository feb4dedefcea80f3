"""The benchmark's DAG: the whole backfill of the stateless MV over TPC-H lineitem.

Only parsed by `bench/run.py` (section 5, orchestration overhead), which points
`AIRFLOW__CORE__DAGS_FOLDER` here and sets `BENCH_TPCH_ROOT` (the upstreams) and
`BENCH_MV_ROOT` (where the MV goes). The upstream is not written to during the run, so
forward finds nothing new and stops after its idle timeout.
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG

from airflow_backfill.job import BackfillJob
from airflow_backfill.task_group import backfill_task_group
from bench.workload import LINEITEM_KEY, STATELESS_QUERY

FORWARD_IDLE_TIMEOUT_S = float(os.environ.get("BENCH_FORWARD_IDLE_TIMEOUT", "1"))

LINEITEM_MV = BackfillJob(
    name="bench_dag_lineitem_mv",
    source="${BENCH_TPCH_ROOT}/lineitem",
    target="${BENCH_MV_ROOT}/bench_dag_lineitem_mv",
    query=STATELESS_QUERY,
    primary_key=LINEITEM_KEY,
    backfill_parallelism=int(os.environ.get("BENCH_BACKFILL_PARALLELISM", "2")),
    parallelism=1,
    lag_threshold=0,
)

with DAG(
    dag_id="bench_lineitem_mv",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["airflow_backfill", "benchmark"],
) as dag:
    backfill_task_group(LINEITEM_MV, forward_idle_timeout=FORWARD_IDLE_TIMEOUT_S)
