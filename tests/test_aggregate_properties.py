"""Property: whatever the upstream does, every commit of an aggregate MV equals the query
recomputed by DuckDB on the upstream as of the commit's watermark.

Hypothesis drives random histories (inserts, updates moving rows between groups,
primary-key updates, deletes, NULLs everywhere) through the three phases: epochs before
the snapshot, epochs caught up in one round, then epochs applied one forward commit at
a time.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from aggregate_upstream import apply_epoch, create, epoch_ops, row_values
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_backfill.engine.phases.catch_up import run_catch_up
from airflow_backfill.engine.phases.forward import ForwardBounds, run_forward
from airflow_backfill.engine.phases.snapshot import run_snapshot
from airflow_backfill.job import BackfillJob
from oracle import assert_every_commit_matches

pytestmark = pytest.mark.spark

QUERIES = {
    "algebraic": (
        "SELECT g, h, COUNT(*) AS n, COUNT(x) AS cx, SUM(x) AS sx, AVG(x) AS ax, SUM(d) AS sd, "
        "AVG(d) AS ad, SUM(f) AS sf, AVG(f) AS af FROM source WHERE id % 7 <> 3 GROUP BY g, h",
        ["g", "h"],
    ),
    "extremes": (
        "SELECT h, MIN(x) AS mn, MAX(x) AS mx, MAX(s) AS ms, MIN(d) AS md, COUNT(DISTINCT s) AS ds, "
        "COUNT(DISTINCT x) AS dx, COUNT(*) AS n FROM source GROUP BY h",
        ["h"],
    ),
    "having": (
        "SELECT g, COUNT(*) AS n, SUM(x) AS sx, MAX(f) AS mf FROM source "
        "GROUP BY g HAVING COUNT(*) >= 2 AND (SUM(x) > 0 OR MIN(d) IS NULL)",  # MIN(d): only in HAVING
        ["g"],
    ),
    "expressions": (
        "SELECT upper(g) AS ug, s, SUM(x) * 2 + COUNT(x) AS e, COALESCE(MIN(x), -100) AS m, COUNT(*) AS n "
        "FROM source WHERE x IS NULL OR x > -3 GROUP BY upper(g), s HAVING n > 1",
        ["ug", "s"],
    ),
}


@settings(max_examples=8, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    query=st.sampled_from(sorted(QUERIES)),
    initial=st.lists(row_values(), max_size=8),
    before_snapshot=st.lists(epoch_ops(), max_size=2),
    catch_up=st.lists(epoch_ops(), min_size=1, max_size=3),
    forward=st.lists(epoch_ops(), min_size=1, max_size=2),
    chunk_bytes=st.sampled_from([1, 1 << 30]),
)
def test_every_commit_matches_the_query_recomputed(
    spark, query, initial, before_snapshot, catch_up, forward, chunk_bytes
):
    sql, key = QUERIES[query]
    with tempfile.TemporaryDirectory() as tmp:
        upstream = create(str(Path(tmp, "upstream")), initial)
        job = BackfillJob(name="agg", source=upstream.uri, target=str(Path(tmp, "mv")), query=sql,
                          primary_key=["id"], lag_threshold=0, poll_interval=0.05, parallelism=1)
        for ops in before_snapshot:
            apply_epoch(upstream, ops)
        snapshot = run_snapshot(spark, job, chunk_bytes=chunk_bytes)
        assert snapshot.epoch == upstream.version()
        for ops in catch_up:
            apply_epoch(upstream, ops)
        assert run_catch_up(spark, job).watermark == upstream.version()
        for ops in forward:
            if apply_epoch(upstream, ops):
                result = run_forward(spark, job, bounds=ForwardBounds(max_epochs=1, idle_timeout=5))
                assert result.watermark == upstream.version()
        checked = assert_every_commit_matches(upstream.uri, job.target, sql, job.app_id, key=key)
        assert checked >= 2
