"""MV-on-MV: a job whose `source` is another job's MV goes through snapshot, catch-up and
forward on that MV's change feed. Each MV is checked at every commit against its query
recomputed by DuckDB on its own upstream (the upstream table, or the first MV) as of
the commit's watermark."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest
from aggregate_upstream import Upstream, apply_epoch, create, random_ops, values
from deltalake import DeltaTable
from helpers_delta import change_feed, cycle_write_ways

from airflow_backfill.engine.phases.catch_up import run_catch_up
from airflow_backfill.engine.phases.forward import ForwardBounds, run_forward
from airflow_backfill.engine.phases.snapshot import run_snapshot
from airflow_backfill.job import BackfillJob
from oracle import assert_every_commit_matches

pytestmark = pytest.mark.spark

# An MV over an aggregate keyed by its NULL-able group runs in the differential harness
# (its `over_grouped` MV, over every column type).
CHAINS = {
    "stateless_then_aggregate": (
        "SELECT id, g, h, x * 2 AS x2, s FROM source WHERE h IS NOT NULL OR x > 0", ["id"], ["id"],
        "SELECT g, COUNT(*) AS n, SUM(x2) AS sx2, AVG(x2) AS ax2, MAX(s) AS ms FROM source GROUP BY g", ["g"],
    ),
    "aggregate_then_aggregate": (
        "SELECT g, h, COUNT(*) AS n, SUM(x) AS sx, MIN(s) AS ms FROM source GROUP BY g, h", ["id"], ["g", "h"],
        "SELECT h, COUNT(*) AS groups, SUM(n) AS total, MAX(sx) AS top, COUNT(DISTINCT ms) AS dms "
        "FROM source GROUP BY h HAVING SUM(n) > 1", ["h"],
    ),
}


def job(name: str, source: str, target: str, query: str, primary_key: list[str]) -> BackfillJob:
    """Rounds always incremental, so that the test's turn of write ways decides each one."""
    return BackfillJob(name=name, source=source, target=target, query=query, primary_key=primary_key,
                       lag_threshold=0, poll_interval=0.05, backfill_parallelism=1, parallelism=1,
                       round_plan="incremental")


def forward_all(spark, mv: BackfillJob) -> None:
    """Forward until the MV reflects its upstream's latest version."""
    latest = DeltaTable(mv.source).version()
    if DeltaTable(mv.target).transaction_version(mv.app_id) < latest:
        run_forward(spark, mv, bounds=ForwardBounds(max_epochs=1, idle_timeout=5))


@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_a_chain_of_mvs_matches_at_every_commit(spark, tmp_path: Path, chain: str, monkeypatch):
    check_chain(spark, str(tmp_path), chain, monkeypatch)


def check_chain(spark, root: str, chain: str, monkeypatch) -> None:
    """Build the chain's two MVs under `root` (a folder or an s3:// prefix) through every
    phase and check both at every commit; the rounds take every way to write in turn, so
    MV2 follows each kind of change feed MV1 can record."""
    cycle_write_ways(monkeypatch)
    query1, key1, mv_key1, query2, mv_key2 = CHAINS[chain]
    rng = random.Random(chain)
    upstream: Upstream = create(f"{root}/upstream", [values(rng) for _ in range(12)])
    mv1 = job("mv1", upstream.uri, f"{root}/mv1", query1, key1)
    mv2 = job("mv2", mv1.target, f"{root}/mv2", query2, mv_key1)

    run_snapshot(spark, mv1)
    # MV1's first round (a MERGE, the first of the ways in turn) updates a row it holds
    ids = sorted(upstream.rows)
    held = next(i for i, row_id in enumerate(ids) if upstream.rows[row_id]["h"] is not None)
    old = upstream.rows[ids[held]]
    updated = {**{k: v for k, v in old.items() if k != "id"}, "x": (old["x"] or 0) + 7}
    apply_epoch(upstream, [("update", held, updated), *random_ops(rng)])
    run_catch_up(spark, mv1)
    run_snapshot(spark, mv2)  # MV2's snapshot reads MV1's files as of MV1's latest commit
    unchanged = min(upstream.rows)
    for ops in (  # MV1 moves several commits ahead before MV2 catches up
        random_ops(rng),
        [("insert", 0, {**values(rng), "h": None, "x": -1})],  # filtered out of the stateless MV1
        [("update", 0, {k: v for k, v in upstream.rows[unchanged].items() if k != "id"})],  # a no-op
        random_ops(rng),
    ):
        apply_epoch(upstream, ops)
        forward_all(spark, mv1)
    run_catch_up(spark, mv2)
    for _ in range(2):  # lockstep: each upstream epoch through MV1, then MV2
        apply_epoch(upstream, random_ops(rng))
        forward_all(spark, mv1)
        forward_all(spark, mv2)

    assert_every_commit_matches(upstream.uri, mv1.target, query1, mv1.app_id, key=mv_key1)
    checked = assert_every_commit_matches(mv1.target, mv2.target, query2, mv2.app_id, key=mv_key2)
    assert checked == 4  # snapshot, one catch-up round, two forward commits
    assert DeltaTable(mv2.target).transaction_version(mv2.app_id) == DeltaTable(mv1.target).version()
    feeds = [Counter(change_feed(mv1.target, version).column("_change_type").to_pylist())
             for version in range(1, DeltaTable(mv1.target).version() + 1)]
    assert any(not feed for feed in feeds), "the chain must include an MV1 commit carrying only a watermark"
    total = sum(feeds, Counter())
    assert total["update_preimage"] == total["update_postimage"] > 0, "MV1's merges must feed MV2 updates"
    assert total["delete"] > 0 and total["insert"] > 0, "MV1's replaces and overwrites must feed MV2 both"

def test_an_mv_of_an_aggregate_sees_none_of_its_state(spark, tmp_path: Path):
    rng = random.Random(5)
    upstream = create(str(tmp_path / "upstream"), [values(rng) for _ in range(6)])
    mv1 = job("mv1", upstream.uri, str(tmp_path / "mv1"),
              "SELECT g, COUNT(*) AS n, AVG(x) AS ax FROM source GROUP BY g", ["id"])
    run_snapshot(spark, mv1)
    mv2 = job("mv2", mv1.target, str(tmp_path / "mv2"), "SELECT * FROM source WHERE n > 0", ["g"])
    run_snapshot(spark, mv2)
    assert DeltaTable(mv2.target).schema().to_arrow().names == ["g", "n", "ax"]
