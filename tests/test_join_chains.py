"""Joins in chains of MVs, on the loopback S3 server: a join whose upstream is another
job's (aggregate) MV, and an MV whose upstream is the join MV. Each MV is checked at
every commit against its query recomputed by DuckDB over its own upstreams as of the
versions the commit records. The join MV either applies its changes or is recomputed every
round, whose change feed (every old row deleted, every new row inserted) the MV over it
must net exactly."""

from __future__ import annotations

import json
import random

import pytest
from helpers_delta import mv_commits
from join_upstreams import create_all, random_epoch

from airflow_backfill.engine.phases.catch_up import run_catch_up
from airflow_backfill.engine.phases.forward import ForwardBounds, run_forward
from airflow_backfill.engine.phases.snapshot import run_snapshot
from airflow_backfill.job import BackfillJob
from oracle import assert_every_commit_matches, assert_every_join_commit_matches

pytestmark = pytest.mark.spark

PER_ORDER = "SELECT i_order, COUNT(*) AS lines, SUM(i_qty) AS qty FROM source GROUP BY i_order"
JOINED = ("SELECT o.o_id, o.o_status, p.lines, p.qty FROM orders o "
          "LEFT JOIN per_order p ON p.i_order = o.o_id WHERE o.o_status IS NOT NULL")
BY_STATUS = "SELECT o_status, COUNT(*) AS n, SUM(qty) AS qty, SUM(lines) AS lines FROM source GROUP BY o_status"


@pytest.mark.parametrize("round_plan", ["incremental", "recompute"])
def test_a_join_over_an_mv_and_an_mv_over_the_join_on_s3(spark, s3_tables, round_plan):
    root = s3_tables["source"].rsplit("/", 1)[0]
    tables = create_all(root, seed=41, names=("orders", "items"))
    common = dict(lag_threshold=0, poll_interval=0.05, backfill_parallelism=2, parallelism=1)
    per_order = BackfillJob(name="per_order", source=tables["items"].uri, target=f"{root}/per_order",
                            query=PER_ORDER, primary_key=["i_order", "i_line"], **common)
    joined = BackfillJob(name="joined", target=f"{root}/joined", query=JOINED, round_plan=round_plan, **common, sources={
        "orders": {"table": tables["orders"].uri, "primary_key": ["o_id"]},
        "per_order": {"table": per_order.target, "primary_key": ["i_order"]},
    })
    by_status = BackfillJob(name="by_status", source=joined.target, target=f"{root}/by_status", query=BY_STATUS,
                            primary_key=["o_id"], **common)
    rng = random.Random(41)
    for job in (per_order, joined, by_status):
        run_snapshot(spark, job)
    for _ in range(2):
        random_epoch(tables["items"], rng)
        random_epoch(tables["orders"], rng)
        run_forward(spark, per_order, bounds=ForwardBounds(idle_timeout=0.1))
        run_catch_up(spark, joined)
        run_catch_up(spark, by_status)

    assert_every_commit_matches(tables["items"].uri, per_order.target, PER_ORDER, per_order.app_id, key=["i_order"])
    vectors = assert_every_join_commit_matches({"orders": tables["orders"].uri, "per_order": per_order.target},
                                               joined.target, JOINED, joined.app_id, key=["o_id"])
    assert vectors[-1] == {"orders": 2, "per_order": 2}
    plans = {json.loads(commit["airflow_backfill.plan"])["plan"] for commit in mv_commits(joined.target)[1:]}
    assert (plans == {"recompute"}) == (round_plan == "recompute"), plans
    assert_every_commit_matches(joined.target, by_status.target, BY_STATUS, by_status.app_id, key=["o_status"])
