"""A Kafka pipeline stays fresh after its backfill: under the shared forward its source job
keeps ingesting the topic and its MV follows the source table once every split is
Finished, so records produced after the backfill reach the MV without anyone rerunning
anything. Checked against the records produced (the Kafka oracle)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import yaml
from kafka_oracle import QUERY, assert_oracle, assert_source_table

from airflow_backfill.engine.writer_lock import writer_lock
from airflow_backfill.job_folder import load_job_folder
from airflow_backfill.kafka.liveness import SOURCE_JOB, running
from airflow_backfill.kafka.positions import backfill_position
from airflow_backfill.kafka.simulator import VALUE_SCHEMA
from airflow_backfill.kafka.source_backfill import PHASE, run_backfill
from airflow_backfill.plugins.api import pipeline_view
from airflow_backfill.plugins.jobs import KnownPipeline
from airflow_backfill.shared_forward.folder import folder_members
from airflow_backfill.shared_forward.loop import SharedForward

pytestmark = pytest.mark.spark


def wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout:.0f} s: {what}")


def test_a_kafka_mv_follows_its_topic_after_the_backfill(spark, kafka_simulator, tmp_path: Path):
    sim = kafka_simulator
    sim.create_topic(2)
    sim.produce({0: 50, 1: 30})
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "orders.yaml").write_text(yaml.safe_dump({
        "upstream": {"bootstrap_servers": sim.bootstrap_servers, "topic": sim.topic, "value_schema": VALUE_SCHEMA},
        "source_job": {"name": "orders_source", "table": "../lake/orders"},
        "backfill": {"name": "orders_mv", "target": "../lake/orders_mv", "query": QUERY,
                     "max_records_per_round": 40},
    }))
    (entry,) = load_job_folder(tmp_path / "jobs").jobs
    pipeline = entry.job
    loop = SharedForward(spark, lambda: folder_members(tmp_path / "jobs"), workers=2, poll_interval=0.1,
                         rescan_interval=0.5)
    stop = threading.Event()
    runner = threading.Thread(target=loop.run, args=(stop,), kwargs={"max_seconds": 600})
    runner.start()
    try:
        # The source job ingests from the start: it is a member of the shared forward.
        wait_until(lambda: running(pipeline.source_job.table, SOURCE_JOB) is not None, 60, "a source job running")
        # The backfill, as its DAG's task runs it, meets the source job.
        with writer_lock(pipeline.backfill.target, pipeline.backfill.name, PHASE):
            assert run_backfill(spark, pipeline.backfill, poll_interval=0.2, timeout=300).finished
        # Records produced after the backfill reach the MV through the shared forward.
        for _ in range(3):
            sim.produce({0: 7, 1: 5})
            time.sleep(0.5)
        ends = {0: 50 + 21 - 1, 1: 30 + 15 - 1}
        wait_until(lambda: backfill_position(pipeline.backfill.target).offsets == ends, 180,
                   "the MV at the topic's end offsets")
    finally:
        stop.set()
        runner.join(120)
    assert not runner.is_alive()
    assert assert_oracle(pipeline.backfill.target, sim.produced) == ends
    assert assert_source_table(pipeline.source_job.table, sim.produced) == ends
    assert loop.members["orders_mv"].commits >= 1 and loop.members["source:orders_source"].commits >= 1
    assert running(pipeline.source_job.table, SOURCE_JOB) is None  # the heartbeat ends with the member
    # The page's view of the pipeline, from the Delta logs alone: every split Finished at the
    # topic's end, the MV in forward and caught up with the source table.
    view = pipeline_view(KnownPipeline(pipeline, ("kafka_dag",)))
    assert [(split["partition"], split["state"], split["offset"]) for split in view["splits"]] == [
        (0, "Finished", ends[0]), (1, "Finished", ends[1])]
    assert (view["status"]["phase"], view["status"]["pending_epochs"]) == ("forward", 0)
