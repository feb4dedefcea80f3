"""Aggregate MVs: NULL semantics, groups that come and go, HAVING, the cost model of a
round, crashes between the state and MV commits, and chunked snapshots. Every MV commit
is checked against the query recomputed by DuckDB at the commit's watermark."""

from __future__ import annotations

import os
from decimal import Decimal

import pyarrow as pa
import pytest
from aggregate_upstream import SCHEMA, Upstream, apply_epoch, create
from deltalake import DeltaTable, write_deltalake
from helpers_delta import mv_commits
from size_overrides import set_sizes

from airflow_backfill.engine.aggregates import apply as aggregate_apply
from airflow_backfill.engine.aggregates import group_rows
from airflow_backfill.engine.aggregates import snapshot as aggregate_snapshot
from airflow_backfill.engine.aggregates.snapshot import partials_uri
from airflow_backfill.engine.aggregates.state import state_uri
from airflow_backfill.engine.delta.log import CHECKPOINT_INTERVAL_PROPERTY, last_commit_metadata
from airflow_backfill.engine.phases.catch_up import run_catch_up
from airflow_backfill.engine.phases.forward import ForwardBounds, run_forward
from airflow_backfill.engine.phases.snapshot import run_snapshot
from airflow_backfill.engine.rounds import feed as round_feed
from airflow_backfill.exceptions import TargetError, UnsupportedQueryError
from airflow_backfill.job import BackfillJob
from oracle import assert_every_commit_matches, expected_rows, mv_rows, table_rows

pytestmark = pytest.mark.spark

ALL = (
    "SELECT g, COUNT(*) AS n, COUNT(x) AS cx, SUM(x) AS sx, AVG(x) AS ax, SUM(d) AS sd, AVG(d) AS ad, "
    "MIN(x) AS mn, MAX(s) AS ms, COUNT(DISTINCT s) AS ds FROM source GROUP BY g"
)


class Killed(Exception):
    """Stands in for SIGKILL inside the test process."""


def row(g=None, h=None, x=None, d=None, f=None, s=None) -> dict:
    return {"g": g, "h": h, "x": x, "d": None if d is None else Decimal(d), "f": f, "s": s}


def job_for(tables: dict[str, str], query: str) -> BackfillJob:
    """An aggregate job whose rounds stay incremental: what these tests check is how a round
    folds changes into the state (a recompute, tested in test_round_plans.py, reads the whole
    upstream; the planner may take it when a loaded machine makes rounds slow)."""
    return BackfillJob(name="agg", query=query, primary_key=["id"], lag_threshold=0, poll_interval=0.05,
                       backfill_parallelism=1, parallelism=1, round_plan="incremental", **tables)


def forward_one(spark, job: BackfillJob) -> None:
    run_forward(spark, job, bounds=ForwardBounds(max_epochs=1, idle_timeout=5))


def check(upstream: Upstream, job: BackfillJob, key: list[str]) -> pa.Table:
    """Every MV commit against DuckDB; returns the query's rows at the latest watermark."""
    assert_every_commit_matches(upstream.uri, job.target, job.query, job.app_id, key=key)
    return expected_rows(upstream.uri, upstream.version(), job.query)


def state_rows(job: BackfillJob) -> list[dict]:
    return table_rows(state_uri(job.target)).to_pylist()


@pytest.mark.parametrize(("held_rows", "feed"), [(10_000, "driver"), (0, "driver"), (10_000, "listed"), (0, "spark")],
                         ids=["touched groups in the driver", "kept in Spark", "feed from listed files",
                              "feed from Spark's reader"])
def test_null_semantics_follow_spark_sql(spark, tables, monkeypatch, held_rows, feed):
    set_sizes(monkeypatch, driver_rows=held_rows, held_table_rows=held_rows)
    if feed != "driver":  # a feed too large for the driver, read from the files its log lists or by Delta
        monkeypatch.setattr(round_feed, "feed_in_driver", lambda *args, **kwargs: None)
    if feed == "spark":
        monkeypatch.setattr(round_feed, "listed_feed", lambda *args, **kwargs: None)
    upstream = create(tables["source"], [
        row(g="a", x=None, d=None, s=None), row(g="a", x=None, d="1.25", s="p"),
        row(g=None, x=3, d="2.50", s="q"), row(g=None, x=None, d=None, s="q"), row(g="b", x=4, s="p"),
    ])
    job = job_for(tables, ALL)
    run_snapshot(spark, job)
    expected = check(upstream, job, ["g"])
    by_group = {r["g"]: r for r in expected.to_pylist()}
    assert by_group["a"]["sx"] is None and by_group["a"]["cx"] == 0  # the data covers SUM of only NULLs
    assert None in by_group  # ... and a NULL group key
    apply_epoch(upstream, [("update", 0, row(g="a", x=2, d=None, s="r")), ("update", 2, row(g=None, x=None))])
    forward_one(spark, job)
    apply_epoch(upstream, [("delete", 0, row()), ("insert", 0, row(g=None, x=None, d="0.10"))])
    forward_one(spark, job)
    check(upstream, job, ["g"])


def test_a_group_leaves_when_its_last_row_does_and_comes_back(spark, tables):
    query = "SELECT g, h, COUNT(*) AS n, SUM(x) AS sx FROM source GROUP BY g, h"
    upstream = create(tables["source"], [row(g="a", h=1, x=1), row(g="a", h=1, x=2), row(g="b", h=None, x=5)])
    job = job_for(tables, query)
    run_snapshot(spark, job)
    apply_epoch(upstream, [("delete", 0, row()), ("update", 0, row(g="b", h=None, x=1))])  # moves the other
    forward_one(spark, job)
    assert "a" not in {r["g"] for r in mv_rows(job.target).to_pylist()}
    assert "a" not in {r["__g0"] for r in state_rows(job)}, "an empty group kept its state"
    apply_epoch(upstream, [("insert", 0, row(g="a", h=1, x=7))])
    forward_one(spark, job)
    assert ("a", 1) in {(r["g"], r["h"]) for r in mv_rows(job.target).to_pylist()}
    check(upstream, job, ["g", "h"])


def test_having_hides_groups_but_keeps_their_state(spark, tables):
    query = "SELECT g, COUNT(*) AS n, SUM(x) AS sx FROM source GROUP BY g HAVING COUNT(*) > 1"
    upstream = create(tables["source"], [row(g="a", x=1), row(g="b", x=2), row(g="b", x=3)])
    job = job_for(tables, query)
    run_snapshot(spark, job)
    assert {r["g"] for r in mv_rows(job.target).to_pylist()} == {"b"}
    assert {r["__g0"] for r in state_rows(job)} == {"a", "b"}
    apply_epoch(upstream, [("insert", 0, row(g="a", x=10)), ("delete", 1, row())])
    run_catch_up(spark, job)
    visible = {r["g"] for r in mv_rows(job.target).to_pylist()}
    assert "a" in visible and "b" not in visible  # a passed HAVING, b stopped passing it
    check(upstream, job, ["g"])


def record_upstream_reads(monkeypatch, job: BackfillJob) -> list[int | None]:
    """The versions at which a round reads the upstream's files, through Spark or by the
    driver's lookup of the groups' rows (the state's reads are not counted)."""
    reads: list[int | None] = []
    real = aggregate_apply.read_upstream_as_of
    real_lookup = group_rows.find_rows

    def recording(spark, uri, version):
        if uri == job.source:
            reads.append(version)
        return real(spark, uri, version)

    def recording_lookup(state, *args, **kwargs):
        found = real_lookup(state, *args, **kwargs)
        if found is not None and state.uri == job.source:
            reads.append(state.version)
        return found

    monkeypatch.setattr(aggregate_apply, "read_upstream_as_of", recording)
    monkeypatch.setattr(group_rows, "read_upstream_as_of", recording)
    monkeypatch.setattr(group_rows, "find_rows", recording_lookup)
    return reads


def test_algebraic_rounds_never_read_the_upstream_files(spark, tables, monkeypatch):
    query = "SELECT g, COUNT(*) AS n, COUNT(x) AS cx, SUM(d) AS sd, AVG(x) AS ax FROM source GROUP BY g"
    upstream = create(tables["source"], [row(g="a", x=1, d="1.00"), row(g="b", x=2)])
    job = job_for(tables, query)
    run_snapshot(spark, job)
    reads = record_upstream_reads(monkeypatch, job)
    apply_epoch(upstream, [("delete", 0, row()), ("update", 0, row(g="a", x=None, d="3.00"))])
    apply_epoch(upstream, [("insert", 0, row(g="c", x=4))])
    run_catch_up(spark, job)
    assert reads == []
    check(upstream, job, ["g"])


def test_min_max_read_the_upstream_only_when_an_extreme_may_have_left(spark, tables, monkeypatch):
    query = "SELECT g, MIN(x) AS mn, MAX(x) AS mx, COUNT(*) AS n FROM source GROUP BY g"
    upstream = create(tables["source"], [row(g="a", x=1), row(g="a", x=5), row(g="a", x=3), row(g="b", x=2)])
    job = job_for(tables, query)
    run_snapshot(spark, job)
    reads = record_upstream_reads(monkeypatch, job)
    apply_epoch(upstream, [("insert", 0, row(g="a", x=9)), ("insert", 0, row(g="b", x=0))])
    forward_one(spark, job)
    apply_epoch(upstream, [("delete", 2, row())])  # x=3: neither the MIN nor the MAX of a
    forward_one(spark, job)
    assert reads == [], "inserts and removals of non-extreme values must not read the upstream"
    apply_epoch(upstream, [("delete", 0, row())])  # x=1: the MIN of a
    forward_one(spark, job)
    assert reads == [upstream.version()]
    check(upstream, job, ["g"])


@pytest.mark.parametrize(("query", "lookups_expected"), [
    # Arrow folds plain columns: past recompute_rows, then past group_rows, Spark reads
    ("SELECT g, MIN(x) AS mn, COUNT(DISTINCT x) AS dx FROM source GROUP BY g", [None, None, 2]),
    # a WHERE and an expression: rows handed Spark's optimizer, past group_rows Spark reads
    ("SELECT g, MIN(x + 1) AS mn, COUNT(DISTINCT x) AS dx FROM source WHERE x > 0 GROUP BY g", [None, 2]),
])
def test_groups_holding_more_rows_than_the_driver_holds_are_read_by_spark(spark, tables, monkeypatch, query,
                                                                          lookups_expected):
    """A few groups of a large upstream are most of it: past `recompute_rows` rows folded by
    Arrow (plain columns) or `group_rows` rows handed Spark (an expression, a WHERE) the
    driver gives up and Spark reads the upstream, and the round stays exact."""
    upstream = create(tables["source"], [row(g="a", x=x) for x in range(1, 7)] + [row(g="b", x=2)])
    job = job_for(tables, query)
    run_snapshot(spark, job)
    lookups: list[int | None] = []
    spark_reads: list[int] = []
    real_lookup, real_read = group_rows.find_rows, group_rows.read_upstream_as_of

    def recording_lookup(*args, **kwargs):
        found = real_lookup(*args, **kwargs)
        lookups.append(None if found is None else found.rows.num_rows)
        return found

    def recording_read(spark, uri, version):
        spark_reads.append(version)
        return real_read(spark, uri, version)

    monkeypatch.setattr(group_rows, "find_rows", recording_lookup)
    monkeypatch.setattr(group_rows, "read_upstream_as_of", recording_read)
    set_sizes(monkeypatch, group_rows=3, recompute_rows=3)
    apply_epoch(upstream, [("delete", 0, row())])  # x=1 leaves: group a (5 rows left) is recomputed
    forward_one(spark, job)
    apply_epoch(upstream, [("delete", 5, row())])  # group b's only row (the last of ids 2 - 7)
    apply_epoch(upstream, [("insert", 0, row(g="b", x=1)), ("insert", 0, row(g="b", x=0))])
    forward_one(spark, job)
    # Spark's read in the first round; the driver's 2 rows of group b in the second
    assert lookups == lookups_expected and len(spark_reads) == 1, (lookups, spark_reads)
    check(upstream, job, ["g"])


def crash_at(monkeypatch, module, point: str) -> None:
    def fake_crash(phase: str, at: str) -> None:
        if at == point:
            raise Killed(f"{phase}:{at}")

    monkeypatch.setattr(module, "maybe_crash", fake_crash)


def watermarks(job: BackfillJob) -> tuple[int | None, int | None]:
    mv = DeltaTable(job.target).transaction_version(job.app_id)
    state = DeltaTable(state_uri(job.target)).transaction_version(job.app_id)
    return mv, state


def test_a_crash_between_the_state_and_mv_commits_is_recovered(spark, tables, monkeypatch):
    upstream = create(tables["source"], [row(g="a", x=1, s="p"), row(g=None, x=2, s="q")])
    job = job_for(tables, ALL)
    run_snapshot(spark, job)
    apply_epoch(upstream, [("update", 0, row(g=None, x=3, s="r")), ("insert", 0, row(g="c", x=None))])
    crash_at(monkeypatch, aggregate_apply, "after_state_commit")
    with pytest.raises(Killed):
        run_catch_up(spark, job)
    assert watermarks(job) == (0, 1), "the state must be committed first"
    monkeypatch.undo()
    apply_epoch(upstream, [("delete", 0, row())])
    run_catch_up(spark, job)
    assert watermarks(job) == (2, 2)
    history = mv_commits(job.target)
    assert [c.get("airflow_backfill.recovered_from_state") for c in history[1:]] == ["true", None]
    check(upstream, job, ["g"])


@pytest.mark.parametrize("held", [True, False], ids=["small state, written first", "large state, written beside"])
def test_a_failed_state_overwrite_leaves_the_mv_uncommitted(spark, tables, monkeypatch, held):
    """A state the driver writes (a patch) is written before the MV's changes; a larger one beside the
    MV's write, the MV committing only after the state did. Either way a state write that
    fails leaves both tables as they were and the round redoable."""
    if not held:
        set_sizes(monkeypatch, driver_rows=0, held_table_rows=0)
    upstream = create(tables["source"], [row(g="a", x=1, s="p"), row(g="b", x=2, s="q")])
    job = job_for(tables, ALL)
    run_snapshot(spark, job)
    apply_epoch(upstream, [("update", 0, row(g="b", x=3, s="r")), ("insert", 0, row(g="c", x=4))])
    real = aggregate_apply.write
    ways: list[str] = []

    def failing_state(spark, prepared, way, **kwargs):
        ways.append(way)
        if prepared.uri == state_uri(job.target):
            raise RuntimeError("the state's disk is full")
        return real(spark, prepared, way, **kwargs)

    monkeypatch.setattr(aggregate_apply, "write", failing_state)
    with pytest.raises(RuntimeError, match="disk is full"):
        run_catch_up(spark, job)
    assert watermarks(job) == (0, 0)
    assert sorted(ways) == (["patch"] if held else ["overwrite", "overwrite"])
    monkeypatch.setattr(aggregate_apply, "write", real)
    run_catch_up(spark, job)
    assert watermarks(job) == (1, 1)
    check(upstream, job, ["g"])


@pytest.mark.parametrize("held", [True, False], ids=["touched groups in the driver", "kept in Spark"])
def test_a_state_whose_count_would_go_negative_is_refused_before_any_write(spark, tables, monkeypatch, held):
    """A state that does not match the upstream (here a group's count lowered by hand) and a
    round that would take the count below zero: the round fails naming the MV and the fix,
    and neither table moves."""
    if not held:
        set_sizes(monkeypatch, driver_rows=0, held_table_rows=0)
    upstream = create(tables["source"], [row(g="a", x=1), row(g="b", x=2)])
    job = job_for(tables, "SELECT g, COUNT(*) AS n FROM source GROUP BY g")
    run_snapshot(spark, job)
    state = spark.read.format("delta").load(state_uri(job.target))
    lowered = state.selectExpr(*(f"CASE WHEN __g0 = 'a' THEN 0L ELSE {c} END AS {c}" if c == "__rows" else c
                                 for c in state.columns)).localCheckpoint()
    lowered.write.format("delta").mode("overwrite").save(state_uri(job.target))
    versions = DeltaTable(job.target).version(), DeltaTable(state_uri(job.target)).version()
    apply_epoch(upstream, [("delete", 0, row())])  # the row of group "a"
    with pytest.raises(TargetError, match=f"state of MV {job.target} went negative.*rerun the snapshot"):
        run_catch_up(spark, job)
    assert (DeltaTable(job.target).version(), DeltaTable(state_uri(job.target)).version()) == versions


@pytest.mark.parametrize("chunked", [False, True], ids=["one chunk", "three chunks"])
def test_a_snapshot_that_crashed_after_its_state_commit_is_redone(spark, tables, monkeypatch, chunked):
    upstream = create(tables["source"], [row(g="a", x=1, s="p"), row(g="b", x=2, s="q")])
    if chunked:  # two more files: a chunk each at chunk_bytes=1
        for rows in ([row(g="a", x=3, s="p")], [row(g=None, x=-4, s="q")]):
            batch = [{"id": upstream.next_id + i, **r} for i, r in enumerate(rows)]
            upstream.next_id += len(rows)
            write_deltalake(upstream.uri, pa.Table.from_pylist(batch, schema=SCHEMA), mode="append")
    options = {"chunk_bytes": 1} if chunked else {}
    job = job_for(tables, ALL)
    crash_at(monkeypatch, aggregate_snapshot, "after_state_commit")
    with pytest.raises(Killed):
        run_snapshot(spark, job, **options)
    # the MV's files were written beside the state's, but never committed
    assert not DeltaTable.is_deltatable(job.target), "a half snapshot is visible"
    assert DeltaTable(state_uri(job.target)).transaction_version(job.app_id) == DeltaTable(upstream.uri).version()
    monkeypatch.undo()
    pinned = DeltaTable(upstream.uri).version()
    apply_epoch(upstream, [("insert", 0, row(g="a", x=5, s="r"))])
    result = run_snapshot(spark, job, **options)
    # three chunks: their partial states were committed and are reused; one chunk: its
    # partial state went straight to the state table, so the chunk is read again
    assert result.chunks_run == (0 if chunked else 1)
    assert not os.path.isdir(partials_uri(job.target))
    referenced = {os.path.basename(uri) for uri in DeltaTable(job.target).file_uris()}
    on_disk = {name for name in os.listdir(job.target) if name.endswith(".parquet")}
    assert on_disk == referenced, "the killed attempt's MV files were left behind"
    assert watermarks(job) == (pinned, pinned)
    run_catch_up(spark, job)
    check(upstream, job, ["g"])


def test_a_chunked_snapshot_combines_partial_states(spark, tables):
    upstream = create(tables["source"], [row(g="a", x=1, s="p"), row(g=None, x=2, s="q")])
    for rows in ([row(g="a", x=1, s="p"), row(g="b", x=None, s="p")], [row(g=None, x=-4, s="q")]):
        batch = [{"id": upstream.next_id + i, **r} for i, r in enumerate(rows)]
        upstream.next_id += len(rows)
        write_deltalake(upstream.uri, pa.Table.from_pylist(batch, schema=SCHEMA), mode="append")
    job = job_for(tables, ALL)
    result = run_snapshot(spark, job, chunk_bytes=1)
    assert result.chunks_run == 3
    check(upstream, job, ["g"])
    referenced = {os.path.normpath(uri.removeprefix("file://")) for uri in DeltaTable(job.target).file_uris()}
    on_disk = {
        os.path.normpath(os.path.join(job.target, name)) for name in os.listdir(job.target) if name.endswith(".parquet")
    }
    assert on_disk == referenced, "chunk partials must not be left in the MV's folder"
    assert not os.path.exists(partials_uri(job.target)), "the partial states outlived the snapshot"


def test_the_mv_holds_exactly_the_query_columns_and_both_tables_checkpoint_rarely(spark, tables):
    query = "SELECT g AS grp, SUM(x) / COUNT(*) AS ratio, COUNT(*) AS n FROM source GROUP BY g"
    upstream = create(tables["source"], [row(g="a", x=1), row(g="a", x=4)])
    job = job_for(tables, query)
    run_snapshot(spark, job)
    assert DeltaTable(job.target).schema().to_arrow().names == expected_rows(upstream.uri, 0, query).column_names
    assert os.path.isdir(os.path.join(state_uri(job.target), "_delta_log"))
    for uri in (job.target, state_uri(job.target)):  # few rows rewritten each round: a checkpoint costs more
        assert DeltaTable(uri).metadata().configuration[CHECKPOINT_INTERVAL_PROPERTY] == "100"


def test_an_empty_upstream_gives_an_empty_mv_that_then_fills(spark, tables):
    upstream = create(tables["source"], [])
    job = job_for(tables, ALL)
    assert run_snapshot(spark, job).rows == 0
    apply_epoch(upstream, [("insert", 0, row(g="a", x=1, s="p")), ("insert", 0, row(g=None, s="q"))])
    forward_one(spark, job)
    assert mv_rows(job.target).num_rows == 2
    check(upstream, job, ["g"])


def test_an_aggregate_the_engine_cannot_maintain_is_refused_when_the_job_loads(tables):
    with pytest.raises(UnsupportedQueryError, match=r"STDDEV\(x\) is not supported"):
        job_for(tables, "SELECT g, STDDEV(x) AS sd FROM source GROUP BY g")
    assert not os.path.exists(tables["target"])


def test_a_changed_query_is_refused_instead_of_reusing_the_state(spark, tables):
    upstream = create(tables["source"], [row(g="a", x=1)])
    run_snapshot(spark, job_for(tables, "SELECT g, COUNT(*) AS n FROM source GROUP BY g"))
    apply_epoch(upstream, [("insert", 0, row(g="b", x=2))])
    changed = job_for(tables, "SELECT g, COUNT(*) AS n, SUM(x) AS sx FROM source GROUP BY g")
    with pytest.raises(TargetError, match="the query changed since the MV was built"):
        run_catch_up(spark, changed)
    assert DeltaTable(changed.target).transaction_version(changed.app_id) == 0


def test_group_by_without_aggregates_keeps_each_distinct_key_while_it_has_rows(spark, tables):
    query = "SELECT g, x FROM source WHERE x IS NOT NULL GROUP BY g, x HAVING g IS NOT NULL OR x > 0"
    upstream = create(tables["source"], [row(g="a", x=1), row(g="a", x=1), row(g=None, x=2), row(g=None, x=-1)])
    job = job_for(tables, query)
    run_snapshot(spark, job)
    apply_epoch(upstream, [("delete", 0, row()), ("update", 2, row(g=None, x=3))])
    forward_one(spark, job)
    apply_epoch(upstream, [("delete", 0, row())])  # the last ("a", 1)
    forward_one(spark, job)
    check(upstream, job, ["g", "x"])


@pytest.mark.parametrize("having", ["", " HAVING COUNT(*) > 1"], ids=["every group shown", "having"])
def test_the_snapshot_records_its_groups_and_mv_rows(spark, tables, having):
    """The groups come from the state commit's metrics; without HAVING the MV has a row per
    group, with it the shown rows are counted."""
    query = f"SELECT g, COUNT(*) AS n FROM source GROUP BY g{having}"
    create(tables["source"], [row(g="a", x=1), row(g="a", x=2), row(g="b", x=3), row(g=None, x=4)])
    job = job_for(tables, query)
    result = run_snapshot(spark, job)
    assert result.rows == mv_rows(job.target).num_rows == (1 if having else 3)
    metadata = last_commit_metadata(job.target)
    assert int(metadata["groups"]) == table_rows(state_uri(job.target)).num_rows == 3
    assert int(metadata["rows"]) == result.rows
