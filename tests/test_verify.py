"""`airflow-backfill verify` recomputes the query with Spark at the MV's watermark: equal on
a correct MV (stateless and aggregate), and it names the key of a row a test corrupts
behind the engine's back."""

from __future__ import annotations

import random

import pytest
import yaml

from airflow_backfill.cli import main
from airflow_backfill.engine.catch_up import run_catch_up
from airflow_backfill.engine.snapshot import run_snapshot
from airflow_backfill.engine.verify import verify_mv
from airflow_backfill.exceptions import TargetError
from airflow_backfill.job import BackfillJob
from airflow_backfill.simulator import commit_epoch, create_orders_table

pytestmark = pytest.mark.spark

STATELESS = "SELECT order_id, status, amount * quantity AS total FROM source WHERE quantity >= 2"
AGGREGATE = "SELECT status, COUNT(*) AS orders, SUM(amount) AS revenue FROM source GROUP BY status"


def built_mv(spark, tables, query: str) -> BackfillJob:
    """An MV built by snapshot + one catch-up round over a few upstream epochs."""
    create_orders_table(tables["source"], rows=400, seed=3)
    job = BackfillJob(name="orders_mv", query=query, primary_key=["order_id"], lag_threshold=0,
                      backfill_parallelism=2, parallelism=1, **tables)
    run_snapshot(spark, job, epoch=0, parallelism=2, chunk_bytes=None)
    rng = random.Random(3)
    for _ in range(3):
        commit_epoch(tables["source"], rng, inserts=20, updates=30, deletes=10)
    run_catch_up(spark, job, parallelism=2)
    return job


def test_verify_is_equal_on_a_correct_mv_and_names_corrupted_keys(spark, tables, tmp_path, capsys, monkeypatch):
    job = built_mv(spark, tables, STATELESS)
    report = verify_mv(spark, job)
    assert report.equal, report.lines()
    assert report.watermark == 3 and report.expected_rows == report.actual_rows > 0
    assert report.differing_ranges == 0 and report.lines()[0].startswith("EQUAL")

    # the command line, on the test's session (it would otherwise start and stop its own)
    import airflow_backfill.engine.spark_session as sessions

    monkeypatch.setattr(sessions, "build_spark_session", lambda name, parallelism: spark)
    monkeypatch.setattr(spark, "stop", lambda: None)
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump({"name": job.name, "query": job.query, "primary_key": ["order_id"],
                                        "lag_threshold": 0, **tables}))
    assert main(["verify", "--job", str(job_file)]) == 0
    assert capsys.readouterr().out.startswith("EQUAL: MV version")

    victim, dropped = spark.read.format("delta").load(job.target).orderBy("order_id").select("order_id").take(2)
    # behind the engine's back: commits that keep the MV's watermark
    spark.sql(f"UPDATE delta.`{job.target}` SET total = total + 1 WHERE order_id = {victim.order_id}")
    spark.sql(f"DELETE FROM delta.`{job.target}` WHERE order_id = {dropped.order_id}")
    report = verify_mv(spark, job)
    assert not report.equal and report.watermark == 3
    assert report.expected_rows == report.actual_rows + 1
    kinds = {difference.key["order_id"]: difference.kind for difference in report.differences}
    assert kinds == {victim.order_id: "changed", dropped.order_id: "missing"}
    assert 1 <= report.differing_ranges <= 2

    assert main(["verify", "--job", str(job_file)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("DIFFERENT") and f"changed key {{'order_id': {victim.order_id}}}" in out


def test_an_aggregate_mv_verifies_and_a_changed_group_is_named(spark, tables):
    job = built_mv(spark, tables, AGGREGATE)
    assert verify_mv(spark, job).equal
    spark.sql(f"UPDATE delta.`{job.target}` SET orders = orders + 1 WHERE status = 'shipped'")
    report = verify_mv(spark, job)
    assert [(d.key, d.kind) for d in report.differences] == [({"status": "shipped"}, "changed")]


def test_verifying_a_missing_mv_is_a_clear_error(tables):
    job = BackfillJob(name="orders_mv", query=STATELESS, primary_key=["order_id"], **tables)
    with pytest.raises(TargetError, match="does not exist yet: run the job's snapshot phase first"):
        verify_mv(None, job)  # type: ignore[arg-type]  # fails before any Spark call
