"""Feeds proportional to the change along a chain of three MVs, each over the one before.

A few keys of many updated upstream must reach each MV over another as a change feed of
about two rows per changed row (a key's old row and its new one), not as the whole table:
whether the MV upstream of it applies the change incrementally or recomputes (then it
writes only the rows that differ). Every MV version must equal its query recomputed on
its own upstream at its watermark (tests/oracle.py).

The tables have a few hundred rows; the round plans see them as `SCALE` times larger
(their per-row rates scaled), where a whole-table feed is what a chain must avoid.
"""

from __future__ import annotations

import random
import shutil
from dataclasses import fields, replace
from pathlib import Path

import pytest
from aggregate_upstream import Upstream, apply_epoch, create, values
from deltalake import DeltaTable

from airflow_backfill.engine import job_state
from airflow_backfill.engine.aggregates import apply as aggregate_apply
from airflow_backfill.engine.delta.change_feed import logged_change_rows
from airflow_backfill.engine.downstream import (
    downstream_jobs,
    feed_readers_count,
    readers_dir,
    register_downstream,
)
from airflow_backfill.engine.phases import apply as stateless_apply
from airflow_backfill.engine.phases.catch_up import run_catch_up
from airflow_backfill.engine.phases.snapshot import run_snapshot
from airflow_backfill.engine.planning.round_plan import Rates
from airflow_backfill.engine.rounds import plan_choice
from airflow_backfill.job import BackfillJob
from oracle import assert_every_commit_matches

pytestmark = pytest.mark.spark

SCALE = 5_000
UPSTREAM_ROWS = 400
UPDATED_KEYS = 2
"""0.5 % of the upstream's keys."""
PER_ROW = [f.name for f in fields(Rates) if f.name.startswith("per_")]

MV1 = "SELECT id, g, h, x * 2 AS x2, d, id % 50 AS bucket FROM source"
MV2 = "SELECT id, g, id % 40 AS bucket, x2 + 1 AS x3, d FROM source WHERE h IS NOT NULL OR g IS NOT NULL"
MV2_AGGREGATE = "SELECT bucket, g, COUNT(*) AS n, SUM(x2) AS sx2, SUM(d) AS sd FROM source GROUP BY bucket, g"
MV3 = "SELECT bucket, COUNT(*) AS n, SUM(x3) AS sx3, SUM(d) AS sd FROM source GROUP BY bucket"
MV3_OVER_AGGREGATE = "SELECT bucket, g, n * 10 AS n10, sd FROM source WHERE n > 0"


@pytest.fixture
def large_tables(monkeypatch):
    """Round plans as for tables `SCALE` times larger than the tests'."""
    measured = plan_choice.rates_at

    def scaled(parallelism: int) -> Rates:
        rates = measured(parallelism)
        return replace(rates, **{name: getattr(rates, name) * SCALE for name in PER_ROW})

    for module in (plan_choice, stateless_apply, aggregate_apply):
        monkeypatch.setattr(module, "rates_at", scaled)


def job(name: str, source: str, root: Path, query: str, key: list[str], round_plan: str = "auto") -> BackfillJob:
    return BackfillJob(name=name, source=source, target=str(root / name), query=query, primary_key=key,
                       lag_threshold=0, backfill_parallelism=2, parallelism=2, round_plan=round_plan)


def feed_and_changed(spark, target: str, before: int, key: list[str]) -> tuple[int, int]:
    """(rows of the MV's change feed after version `before`, MV keys whose row changed)."""
    after = DeltaTable(target).version()
    if after == before:
        return 0, 0
    feed = (spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", before + 1)
            .option("endingVersion", after).load(target))
    old = spark.read.format("delta").option("versionAsOf", before).load(target)
    new = spark.read.format("delta").option("versionAsOf", after).load(target)
    changed = new.exceptAll(old).select(*key).unionByName(old.exceptAll(new).select(*key)).distinct().count()
    return feed.count(), changed


def update_some(upstream: Upstream, rng: random.Random) -> None:
    """One upstream commit updating `UPDATED_KEYS` rows (new values, same keys)."""
    ids = sorted(upstream.rows)
    assert apply_epoch(upstream, [("update", ids.index(i), values(rng)) for i in rng.sample(ids, UPDATED_KEYS)])


def catch_up_chain(spark, chain: list[tuple[BackfillJob, list[str]]]) -> dict[str, tuple[int, int, str]]:
    """Catch each MV up in turn; per MV its feed rows, changed rows and round plan."""
    found = {}
    for mv, key in chain:
        before = DeltaTable(mv.target).version()
        result = run_catch_up(spark, mv)
        feed, changed = feed_and_changed(spark, mv.target, before, key)
        found[mv.name] = (feed, changed, ",".join(r.plan for r in result.rounds))
    return found


def check_every_commit(upstream: Upstream, chain: list[tuple[BackfillJob, list[str]]]) -> None:
    for mv, key in chain:
        assert_every_commit_matches(mv.source, mv.target, mv.query, mv.app_id, key=key)


def test_a_small_upstream_change_feeds_each_mv_of_a_chain_about_two_rows_per_changed_row(
        spark, tmp_path, large_tables):
    rng = random.Random(62)
    upstream = create(str(tmp_path / "upstream"), [values(rng) for _ in range(UPSTREAM_ROWS)])
    mv1 = job("mv1", upstream.uri, tmp_path, MV1, ["id"])
    mv2 = job("mv2", mv1.target, tmp_path, MV2, ["id"])
    mv3 = job("mv3", mv2.target, tmp_path, MV3, ["id"])
    chain = [(mv1, ["id"]), (mv2, ["id"]), (mv3, ["bucket"])]
    for mv, _ in chain:
        run_snapshot(spark, mv)
    assert [job.name for job in downstream_jobs(mv1.target)] == ["mv2"]
    assert feed_readers_count(mv2.target) == 1 and feed_readers_count(mv3.target) == 0
    update_some(upstream, rng)
    found = catch_up_chain(spark, chain)
    for name in ("mv1", "mv2"):  # the feeds an MV of the chain reads
        feed, changed, _ = found[name]
        assert 0 < changed <= 2 * UPDATED_KEYS and feed <= 2 * changed, (name, found)
    assert found["mv3"][1] > 0, found
    check_every_commit(upstream, chain)


def test_recomputes_along_a_chain_write_only_the_rows_that_differ(spark, tmp_path, large_tables):
    """A stateless MV and an aggregate over it, both pinned to recompute, each with readers
    (the next MV, or two report jobs whose snapshots have started): each recompute writes
    its difference. The aggregate, pinned to recompute, reads the first MV whole, so it
    is no reader of that MV's feed."""
    rng = random.Random(7)
    upstream = create(str(tmp_path / "upstream"), [values(rng) for _ in range(UPSTREAM_ROWS)])
    mv1 = job("mv1", upstream.uri, tmp_path, MV1, ["id"], round_plan="recompute")
    mv2 = job("mv2", mv1.target, tmp_path, MV2_AGGREGATE, ["id"], round_plan="recompute")
    mv3 = job("mv3", mv2.target, tmp_path, MV3_OVER_AGGREGATE, ["bucket", "g"])
    chain = [(mv1, ["id"]), (mv2, ["bucket", "g"]), (mv3, ["bucket", "g"])]
    for mv, _ in chain:
        run_snapshot(spark, mv)
    for upstream_mv in (mv1, mv2):
        for name in ("report_a", "report_b"):
            report = job(f"{upstream_mv.name}_{name}", upstream_mv.target, tmp_path, "SELECT * FROM source", ["id"])
            job_state.update_state(report.target, phase=job_state.PHASE_SNAPSHOT)  # its snapshot has started
            register_downstream(report)
    assert feed_readers_count(mv1.target) == 2 and feed_readers_count(mv2.target) == 3
    update_some(upstream, rng)
    found = catch_up_chain(spark, chain)
    assert found["mv1"][2] == found["mv2"][2] == "recompute (mv difference)", found
    for name in ("mv1", "mv2"):
        feed, changed, _ = found[name]
        assert 0 < changed and feed <= 2 * changed, (name, found)
    check_every_commit(upstream, chain)


def test_a_job_that_always_recomputes_or_is_gone_reads_no_feed(spark, tmp_path):
    rng = random.Random(3)
    upstream = create(str(tmp_path / "upstream"), [values(rng) for _ in range(20)])
    mv1 = job("mv1", upstream.uri, tmp_path, MV1, ["id"])
    run_snapshot(spark, mv1)
    assert not Path(readers_dir(upstream.uri)).exists()  # a user's table takes no registration
    run_snapshot(spark, job("nightly", mv1.target, tmp_path, "SELECT id FROM source", ["id"],
                            round_plan="recompute"))
    run_snapshot(spark, job("gone", mv1.target, tmp_path, "SELECT id FROM source", ["id"]))
    assert sorted(j.name for j in downstream_jobs(mv1.target)) == ["gone", "nightly"]
    assert feed_readers_count(mv1.target) == 1
    shutil.rmtree(tmp_path / "gone")
    assert [j.name for j in downstream_jobs(mv1.target)] == ["nightly"]
    assert feed_readers_count(mv1.target) == 0


def test_a_replace_commits_change_rows_are_counted_from_its_log(spark, tmp_path, large_tables):
    """Before an MV reads the feed of the MV it is over, it counts that feed's rows from the
    log: a replace's deletion vectors mark the replaced rows, which the files' bytes do not
    tell (they counted every touched file twice and whole)."""
    rng = random.Random(11)
    upstream = create(str(tmp_path / "upstream"), [values(rng) for _ in range(UPSTREAM_ROWS)])
    mv1 = job("mv1", upstream.uri, tmp_path, MV1, ["id"], round_plan="incremental")
    run_snapshot(spark, mv1)
    before = DeltaTable(mv1.target).version()
    update_some(upstream, rng)
    run_catch_up(spark, mv1)
    version = DeltaTable(mv1.target).version()
    assert version == before + 1
    feed, _ = feed_and_changed(spark, mv1.target, before, ["id"])
    assert logged_change_rows(mv1.target, version) == feed > 0
