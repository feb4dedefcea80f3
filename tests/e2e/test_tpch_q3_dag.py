"""`airflow dags test example_tpch_q3` while TPC-H refreshes (RF1, RF2) keep committing to
`orders` and `lineitem`: the Q3 join MV then equals its query recomputed independently
over every upstream as of the versions each commit records."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers_delta import mv_commits
from test_tpch_dag import airflow_environment, dags_test_under_refreshes, load_example_dag

from airflow_backfill import tpch
from oracle import assert_every_join_commit_matches

pytestmark = pytest.mark.e2e


def example_job(home: Path):
    return load_example_dag(home, "example_tpch_q3").TPCH_Q3


def test_dags_test_maintains_q3_while_orders_and_lineitem_refresh(tmp_path):
    home, env = airflow_environment(tmp_path)
    tables = tpch.load_tpch(str(home / "tpch"), 0.01, files=4, tables=tpch.LOADABLE)
    job = example_job(home)
    assert [u.table for u in job.upstreams] == [tables.customer, tables.orders, tables.lineitem]
    output = dags_test_under_refreshes("example_tpch_q3", env, tables, job.target)
    for task in ("pin_epoch", "snapshot", "catch_up", "wait_caught_up", "forward"):
        assert f"q3.{task}" in output

    upstreams = {upstream.name: upstream.table for upstream in job.upstreams}
    vectors = assert_every_join_commit_matches(upstreams, job.target, job.query, job.app_id,
                                               key=["l_orderkey", "o_orderdate", "o_shippriority"])
    assert vectors[0]["customer"] == vectors[-1]["customer"] == 0
    assert vectors[-1]["orders"] > vectors[0]["orders"] and vectors[-1]["lineitem"] > vectors[0]["lineitem"], \
        "the MV applied no refresh committed after its snapshot"
    assert {commit["airflow_backfill.phase"] for commit in mv_commits(job.target)} >= {"snapshot", "forward"}
