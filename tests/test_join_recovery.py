"""A join MV killed at every named fault point, rerun, under concurrent writers and a
second run: every MV commit still equals the query over each upstream as of its
recorded version, and no upstream's changes are applied twice.

The kills are simulated in-process: the fault point raises instead of SIGKILLing the
test's own process. Nothing between a fault point and the exception's way out writes to
disk (a `finally` only unpersists or releases the writer lock, which a killed process
releases too), so the tables are left as a kill leaves them; tests/e2e/test_join_killed.py
kills a real spark-submit once."""

from __future__ import annotations

import os
import random
import threading

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from helpers_delta import mv_commits
from join_upstreams import create_all, random_epoch, random_row, sources

import airflow_backfill.engine.aggregates.apply as aggregate_apply
import airflow_backfill.engine.joins.apply as join_apply
import airflow_backfill.engine.snapshot_chunks.run as snapshot_module
from airflow_backfill.engine.delta.commits import CommitInfo, commit_watermark_only
from airflow_backfill.engine.phases.catch_up import run_catch_up
from airflow_backfill.engine.phases.forward import ForwardBounds, run_forward
from airflow_backfill.engine.phases.snapshot import run_snapshot
from airflow_backfill.engine.writer_lock import writer_lock
from airflow_backfill.exceptions import TargetError, UpstreamError
from airflow_backfill.job import BackfillJob
from oracle import assert_every_join_commit_matches

pytestmark = pytest.mark.spark

STATELESS = ("SELECT i.i_order, i.i_line, i.i_qty, o.o_status, c.c_segment FROM items i "
             "JOIN orders o ON i.i_order = o.o_id LEFT JOIN customer c ON c.c_id = o.o_cust")
AGGREGATE = ("SELECT o.o_cust, COUNT(*) AS n, SUM(i.i_qty) AS qty FROM orders o JOIN items i ON i.i_order = o.o_id "
             "GROUP BY o.o_cust")


class Killed(BaseException):
    """What a fault point raises here instead of SIGKILL."""


def kill_at(monkeypatch, module, point: str) -> None:
    def crash(phase: str, at: str) -> None:
        if at == point:
            raise Killed(f"{phase}:{at}")

    monkeypatch.setattr(module, "maybe_crash", crash)


def killed_at_each_point_then_rerun(spark, job, tables, rng, monkeypatch, module, rerun) -> None:
    """Per fault point of a round's write: new epochs on `orders` and `items`, a catch-up
    killed at that point of `module`, then `rerun()`."""
    for point in ("after_write", "after_commit"):
        random_epoch(tables["orders"], rng)
        random_epoch(tables["items"], rng)
        kill_at(monkeypatch, module, point)
        with pytest.raises(Killed):
            run_catch_up(spark, job)
        monkeypatch.undo()
        rerun()


def join_job(tables, target: str, query: str, round_plan: str = "incremental") -> BackfillJob:
    """Rounds that apply their changes unless asked otherwise: under `auto` tables this small
    are recomputed (tests/test_join_recompute.py)."""
    return BackfillJob(name="joined", target=target, query=query, sources=sources(tables), lag_threshold=0,
                       poll_interval=0.05, backfill_parallelism=2, parallelism=1, round_plan=round_plan)


def uris(tables) -> dict[str, str]:
    return {name: table.uri for name, table in tables.items()}


def test_a_killed_join_resumes_at_every_fault_point(spark, tmp_path, monkeypatch):
    tables = create_all(str(tmp_path), seed=21)
    rng = random.Random(21)
    items = tables["items"]
    extra = [random_row("items", rng, (100 + n, 0)) for n in range(3)]
    write_deltalake(items.uri, pa.Table.from_pylist(extra, schema=items.schema), mode="append")
    items.rows.update({(row["i_order"], row["i_line"]): row for row in extra})  # items now has two files
    job = join_job(tables, str(tmp_path / "mv"), STATELESS)

    kill_at(monkeypatch, snapshot_module, "after_chunks=1")
    with pytest.raises(Killed):
        run_snapshot(spark, job, chunk_bytes=1)
    kill_at(monkeypatch, snapshot_module, "after_write")
    with pytest.raises(Killed):
        run_snapshot(spark, job, chunk_bytes=1)  # the second chunk, then killed before the watermark
    monkeypatch.undo()
    resumed = run_snapshot(spark, job, chunk_bytes=1)
    assert resumed.chunks_run == 0 and not resumed.skipped

    def forward_more() -> None:  # the rerun finds more: forward applies both
        random_epoch(tables["customer"], rng)
        run_forward(spark, job, bounds=ForwardBounds(max_epochs=1, idle_timeout=5))

    killed_at_each_point_then_rerun(spark, job, tables, rng, monkeypatch, join_apply, forward_more)

    vectors = assert_every_join_commit_matches(uris(tables), job.target, STATELESS, job.app_id,
                                               key=["i_order", "i_line"])
    phases = [commit["airflow_backfill.phase"] for commit in mv_commits(job.target)]
    assert phases == ["snapshot", "forward", "catch_up", "forward"], "a killed commit was redone or lost"
    assert vectors[-1] == {name: table.version() for name, table in tables.items()}


@pytest.mark.parametrize("round_plan", ["incremental", "recompute"])
def test_an_aggregate_join_killed_between_its_state_and_mv_commits(spark, tmp_path, monkeypatch, round_plan):
    tables = create_all(str(tmp_path), seed=22, names=("orders", "items"))
    rng = random.Random(22)
    job = join_job(tables, str(tmp_path / "mv"), AGGREGATE, round_plan)
    run_snapshot(spark, job)
    random_epoch(tables["orders"], rng)
    random_epoch(tables["items"], rng)
    kill_at(monkeypatch, aggregate_apply, "after_state_commit")
    with pytest.raises(Killed):
        run_catch_up(spark, job)
    monkeypatch.undo()
    random_epoch(tables["items"], rng)
    run_catch_up(spark, job)  # brings the MV to the state's vector, then applies the new epoch
    commits = mv_commits(job.target)
    assert [c.get("airflow_backfill.recovered_from_state") for c in commits] == [None, "true", None]
    vectors = assert_every_join_commit_matches(uris(tables), job.target, AGGREGATE, job.app_id, key=["o_cust"])
    assert vectors == [{"orders": 0, "items": 0}, {"orders": 1, "items": 1}, {"orders": 1, "items": 2}]


def test_concurrent_writers_on_two_upstreams_and_a_second_run(spark, tmp_path):
    tables = create_all(str(tmp_path), seed=23)
    job = join_job(tables, str(tmp_path / "mv"), STATELESS)
    run_snapshot(spark, job)
    stop = threading.Event()

    def write(name: str, seed: int) -> None:
        """Commits every 0.2 s until stopped, and at least three times whatever the rounds' pace."""
        rng = random.Random(seed)
        while not stop.wait(0.2) or tables[name].version() < 3:
            random_epoch(tables[name], rng)

    writers = [threading.Thread(target=write, args=(name, seed), daemon=True)
               for name, seed in (("orders", 1), ("items", 2))]
    for writer in writers:
        writer.start()
    try:
        run_catch_up(spark, job.with_overrides(lag_threshold=3))
        with writer_lock(job.target, job.name, "forward"), pytest.raises(TargetError, match="another run of job"):
            run_catch_up(spark, job)  # a second run of the job is refused while the first writes
        run_forward(spark, job, bounds=ForwardBounds(max_epochs=6, idle_timeout=30))
    finally:
        stop.set()
        for writer in writers:
            writer.join(timeout=30)
    run_forward(spark, job, bounds=ForwardBounds(idle_timeout=0.5))  # what the writers committed last
    vectors = assert_every_join_commit_matches(uris(tables), job.target, STATELESS, job.app_id,
                                               key=["i_order", "i_line"])
    assert vectors[-1] == {name: table.version() for name, table in tables.items()}
    assert vectors[-1]["orders"] >= 3 and vectors[-1]["items"] >= 3 and vectors[-1]["customer"] == 0


def test_a_round_refuses_an_mv_whose_vector_disagrees_with_its_watermark(spark, tmp_path):
    tables = create_all(str(tmp_path), seed=24, names=("orders", "items"))
    query = ("SELECT i.i_order, i.i_line, o.o_status FROM items i JOIN orders o ON i.i_order = o.o_id")
    job = join_job(tables, str(tmp_path / "mv"), query)
    run_snapshot(spark, job)
    info = CommitInfo(phase="forward", epoch=5, parallelism=1, rows=0)
    commit_watermark_only(spark, job.target, app_id=job.app_id, version=5,
                          user_metadata=info.user_metadata(job))  # a watermark without its vector
    random_epoch(tables["items"], random.Random(24))
    before = DeltaTable(job.target).version()
    with pytest.raises(TargetError, match=r"records upstream versions \{'items': 0, 'orders': 0\} that do not "
                                          r"match its watermark 5"):
        run_catch_up(spark, job)
    assert DeltaTable(job.target).version() == before


def test_a_filtered_stateless_join_read_in_one_chunk_is_created_in_one_commit(spark, tmp_path):
    tables = create_all(str(tmp_path), seed=26)
    filtered = f"{STATELESS} WHERE i.i_qty > 2"
    job = join_job(tables, str(tmp_path / "mv"), filtered)
    assert run_snapshot(spark, job).chunks_run == 1
    assert len(DeltaTable(job.target).history()) == 1, "no chunk commit and no separate watermark commit"
    (snapshot,) = mv_commits(job.target)
    assert snapshot["airflow_backfill.phase"] == "snapshot" and snapshot["airflow_backfill.chunks"] == "1"
    assert int(snapshot["airflow_backfill.rows"]) == spark.read.format("delta").load(job.target).count() > 0
    rng = random.Random(26)
    random_epoch(tables["orders"], rng)
    random_epoch(tables["items"], rng)
    run_catch_up(spark, job)
    assert_every_join_commit_matches(uris(tables), job.target, filtered, job.app_id, key=["i_order", "i_line"])


@pytest.mark.parametrize("chunk_bytes", [None, 1], ids=["one commit", "chunk commits"])
def test_a_repeated_upstream_key_refuses_the_snapshot_and_leaves_no_mv(spark, tmp_path, chunk_bytes):
    tables = create_all(str(tmp_path), seed=25, names=("orders", "items"))
    orders = tables["orders"]
    joined = next(row for row in orders.rows.values()
                  if any(item["i_order"] == row["o_id"] for item in tables["items"].rows.values()))
    write_deltalake(orders.uri, pa.Table.from_pylist([{**joined, "o_status": "again"}], schema=orders.schema),
                    mode="append")
    job = join_job(tables, str(tmp_path / "mv"), "SELECT i.i_order, i.i_line, o.o_status FROM items i "
                   "JOIN orders o ON i.i_order = o.o_id WHERE i.i_line >= 0")
    with pytest.raises(UpstreamError, match=r"the join holds MV key i_order=\d+, i_line=\d+ 2 times at versions"):
        run_snapshot(spark, job, **({} if chunk_bytes is None else {"chunk_bytes": chunk_bytes}))
    assert [name for name in os.listdir(job.target) if name != "_airflow_backfill"] == []
