"""Source job and per-partition source backfill against a loopback Kafka broker."""

from __future__ import annotations

from pathlib import Path

import pytest
from kafka_oracle import QUERY, assert_oracle

from airflow_backfill.kafka.config import KafkaBackfillJob, KafkaSourceJob, KafkaTopic
from airflow_backfill.kafka.positions import backfill_position, source_position
from airflow_backfill.kafka.simulator import VALUE_SCHEMA
from airflow_backfill.kafka.source_backfill import run_backfill_round
from airflow_backfill.kafka.source_job import run_source_round
from airflow_backfill.kafka.split_state import BACKFILLING, FINISHED, SOURCE_CACHING_UP

pytestmark = pytest.mark.spark


def _jobs(simulator, tmp_path: Path, per_round: int = 40) -> tuple[KafkaSourceJob, KafkaBackfillJob]:
    topic = KafkaTopic(simulator.bootstrap_servers, simulator.topic, VALUE_SCHEMA)
    source = KafkaSourceJob(name="orders_source", upstream=topic, table=str(tmp_path / "orders"),
                            max_records_per_round=per_round)
    backfill = KafkaBackfillJob(
        name="orders_mv", upstream=topic, source_table=source.table, query=QUERY,
        target=str(tmp_path / "orders_mv"), max_records_per_round=per_round,
    )
    return source, backfill


def _kinds(target: str) -> dict[int, str]:
    return {p: s.kind for p, s in backfill_position(target).splits.items()}


def test_backfill_meets_the_running_source_job(spark, kafka_simulator, tmp_path):
    sim = kafka_simulator
    sim.create_topic(3)
    sim.produce({0: 120, 1: 30, 2: 0})
    source, backfill = _jobs(sim, tmp_path)
    run_source_round(spark, source)
    sim.produce({0: 10, 1: 50, 2: 5})
    seen = set()
    for _ in range(12):
        result = run_backfill_round(spark, backfill)
        if result.committed:
            assert_oracle(backfill.target, sim.produced)
        seen |= {s.kind for s in result.splits.values()}
        run_source_round(spark, source)
        sim.produce({0: 3, 1: 1})
    assert seen >= {BACKFILLING, FINISHED}
    for _ in range(6):
        run_source_round(spark, source)
        result = run_backfill_round(spark, backfill)
        if result.committed:
            assert_oracle(backfill.target, sim.produced)
    assert set(_kinds(backfill.target).values()) == {FINISHED}
    committed = source_position(source.table)
    offsets = assert_oracle(backfill.target, sim.produced)
    assert offsets == committed.offsets | {p: offsets[p] for p in offsets if p not in committed.offsets}
