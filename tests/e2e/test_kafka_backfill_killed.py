"""A source backfill run by spark-submit's entry point, SIGKILLed after a commit, then resumed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from kafka_oracle import QUERY, assert_oracle

from airflow_backfill.kafka.config import load_kafka_pipeline
from airflow_backfill.kafka.positions import backfill_position
from airflow_backfill.kafka.simulator import VALUE_SCHEMA
from airflow_backfill.kafka.source_job import run_source_round

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.e2e, pytest.mark.spark]


def _run_backfill(job_file: Path, fault: str | None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("AIRFLOW_BACKFILL_FAULT", None)
    if fault:
        env["AIRFLOW_BACKFILL_FAULT"] = fault
    return subprocess.run(
        [sys.executable, str(ROOT / "spark_jobs" / "kafka_backfill.py"), "--job", str(job_file), "--timeout", "240"],
        env=env, capture_output=True, text=True, timeout=300,
    )


def test_sigkill_after_a_commit_resumes_from_the_split_states(spark, kafka_simulator, tmp_path):
    sim = kafka_simulator
    sim.create_topic(2)
    sim.produce({0: 70, 1: 20})
    job_file = tmp_path / "kafka_job.yaml"
    job_file.write_text(yaml.safe_dump({
        "upstream": {"bootstrap_servers": sim.bootstrap_servers, "topic": sim.topic, "value_schema": VALUE_SCHEMA},
        "source_job": {"name": "src", "table": str(tmp_path / "orders")},
        "backfill": {"name": "mv", "query": QUERY, "target": str(tmp_path / "mv"), "max_records_per_round": 30},
    }))
    pipeline = load_kafka_pipeline(str(job_file))
    run_source_round(spark, pipeline.source_job)

    killed = _run_backfill(job_file, "kafka_backfill:after_commit")
    assert killed.returncode == -9, killed.stderr[-2000:]
    first = backfill_position(pipeline.backfill.target)
    assert first.round == 1 and {str(s) for s in first.splits.values()} == {"Backfilling(29)", "Finished(19)"}
    assert_oracle(pipeline.backfill.target, sim.produced)

    resumed = _run_backfill(job_file, None)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    final = backfill_position(pipeline.backfill.target)
    assert final.finished and final.offsets == {0: 69, 1: 19} and final.round == 3
    assert_oracle(pipeline.backfill.target, sim.produced)
