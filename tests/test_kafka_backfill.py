"""Source job and per-partition source backfill against a loopback Kafka broker.

Rounds are interleaved by hand, so each test decides exactly when the source job runs,
stops, or a partition is added; the oracle is checked after every MV commit.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from kafka_oracle import QUERY, assert_oracle

from airflow_backfill.engine import control
from airflow_backfill.engine.delta.log import table_exists
from airflow_backfill.exceptions import UpstreamError
from airflow_backfill.kafka import source_backfill
from airflow_backfill.kafka.config import KafkaBackfillJob, KafkaSourceJob, KafkaTopic
from airflow_backfill.kafka.positions import backfill_position, source_position
from airflow_backfill.kafka.records import RecordDecodeError
from airflow_backfill.kafka.simulator import VALUE_SCHEMA
from airflow_backfill.kafka.source_backfill import run_backfill_round
from airflow_backfill.kafka.source_job import run_source_round
from airflow_backfill.kafka.split_state import BACKFILLING, FINISHED, SOURCE_CACHING_UP

pytestmark = pytest.mark.spark


def _jobs(simulator, tmp_path: Path, budget: int = 40, **backfill_fields) -> tuple[KafkaSourceJob, KafkaBackfillJob]:
    topic = KafkaTopic(simulator.bootstrap_servers, simulator.topic, VALUE_SCHEMA)
    source = KafkaSourceJob(name="orders_source", upstream=topic, table=str(tmp_path / "orders"),
                            max_records_per_round=10_000)
    backfill = KafkaBackfillJob(
        name="orders_mv", upstream=topic, source_table=source.table, query=QUERY,
        target=str(tmp_path / "orders_mv"), max_records_per_round=budget, **backfill_fields,
    )
    return source, backfill


def _states(target: str) -> dict[int, str]:
    return {p: str(s) for p, s in backfill_position(target).splits.items()}


def test_splits_meet_the_source_job_with_a_stop_and_an_added_partition(spark, kafka_simulator, tmp_path):
    sim = kafka_simulator
    sim.create_topic(2)
    sim.produce({0: 90, 1: 10})
    source, backfill = _jobs(sim, tmp_path)
    run_source_round(spark, source)                      # committed: p0=89, p1=9
    sim.produce({0: 10, 1: 20})                          # Kafka now: p0 0..99, p1 0..29

    run_backfill_round(spark, backfill)
    assert _states(backfill.target) == {0: "Backfilling(39)", 1: "SourceCachingUp(29)"}
    assert_oracle(backfill.target, sim.produced)

    # the source job is stopped; a partition is added while the backfill runs
    sim.add_partitions(3)
    sim.produce({2: 5})
    run_backfill_round(spark, backfill)
    assert _states(backfill.target) == {0: "Backfilling(79)", 1: "SourceCachingUp(29)", 2: "SourceCachingUp(4)"}
    assert_oracle(backfill.target, sim.produced)

    run_source_round(spark, source)                      # resumes: committed p0=99, p1=29, p2=4
    run_backfill_round(spark, backfill)
    assert _states(backfill.target) == {0: "Finished(99)", 1: "Finished(29)", 2: "Finished(4)"}
    assert_oracle(backfill.target, sim.produced)

    sim.produce({0: 7, 1: 3, 2: 11})                     # Finished splits follow the source table
    run_source_round(spark, source)
    result = run_backfill_round(spark, backfill)
    assert result.finished and result.kafka_records == 0
    offsets = assert_oracle(backfill.target, sim.produced)
    committed = source_position(source.table)
    assert offsets == committed.offsets == {0: 106, 1: 32, 2: 15}
    assert backfill_position(backfill.target).source_version == committed.version
    assert not run_backfill_round(spark, backfill).committed  # nothing new: no empty commit


class Killed(Exception):
    """Stands for a SIGKILL at a fault point: nothing after it runs."""


def test_kills_in_every_state_resume_without_rereading(spark, kafka_simulator, tmp_path, monkeypatch):
    sim = kafka_simulator
    sim.create_topic(3)
    sim.produce({0: 100, 1: 25, 2: 60})
    source, backfill = _jobs(sim, tmp_path, budget=30)
    run_source_round(spark, source)
    sim.produce({1: 15})

    rng = random.Random(int(os.environ.get("KAFKA_KILL_SEED", "7")))
    reads: list[dict[int, tuple[int, int]]] = []
    real_read = source_backfill.read_records
    monkeypatch.setattr(source_backfill, "read_records",
                        lambda spark_, upstream, ranges, n: reads.append(dict(ranges)) or real_read(spark_, upstream, ranges, n))
    paced: list[int | None] = []
    monkeypatch.setattr(source_backfill, "pace", lambda rows, elapsed, rate: paced.append(rate))
    armed: dict[str, str] = {}

    def crash(phase: str, point: str) -> None:
        if armed.pop(point, None):
            raise Killed(point)

    monkeypatch.setattr(source_backfill, "maybe_crash", crash)
    states_seen: set[str] = set()
    kills = 0
    for round_index in range(8):
        if round_index == 2:
            control.write_overrides(backfill.target, rate_limit=5000)   # altered live, between rounds
        if round_index == 5:
            run_source_round(spark, source)                             # lets SourceCachingUp splits finish
        before = backfill_position(backfill.target)
        armed[rng.choice(["before_commit", "after_commit"])] = "armed"
        try:
            run_backfill_round(spark, backfill)
        except Killed:
            kills += 1
        armed.clear()  # a round with nothing to commit reaches no fault point
        after_kill = backfill_position(backfill.target)
        assert after_kill.round in (before.round, before.round + 1)
        if after_kill.round == before.round + 1:
            assert_oracle(backfill.target, sim.produced)
        reads_before_resume = len(reads)
        result = run_backfill_round(spark, backfill)                    # the resumed run
        if result.committed:
            assert_oracle(backfill.target, sim.produced)
        states_seen |= {s.kind for s in backfill_position(backfill.target).splits.values()}
        for resumed_reads in reads[reads_before_resume:]:
            past_backfilling = {p for p, s in after_kill.splits.items() if s.kind != BACKFILLING}
            assert not past_backfilling & set(resumed_reads), "a split past Backfilling was read from Kafka again"
            for partition, (start, _) in resumed_reads.items():
                resumed_from = after_kill.splits[partition].offset if partition in after_kill.splits else -1
                assert start == resumed_from + 1, "the resumed run did not continue from the committed split offset"
        if result.finished:
            break
    assert kills >= 4
    assert states_seen >= {BACKFILLING, SOURCE_CACHING_UP, FINISHED}
    assert backfill_position(backfill.target).finished
    assert paced[:2] == [None, None] and 5000 in paced


def test_bad_input_stops_before_anything_is_written(spark, kafka_simulator, tmp_path):
    sim = kafka_simulator
    sim.create_topic(2)
    _, missing = _jobs(sim, tmp_path)
    missing = KafkaBackfillJob(**{**missing.__dict__, "upstream": KafkaTopic(sim.bootstrap_servers, "no-such-topic", VALUE_SCHEMA)})
    with pytest.raises(UpstreamError, match="'no-such-topic' does not exist"):
        run_backfill_round(spark, missing)
    assert not table_exists(missing.target)

    sim.produce({0: 20, 1: 5})
    bad_offset = sim.produce_raw(1, b"{not json")
    _, backfill = _jobs(sim, tmp_path)
    with pytest.raises(RecordDecodeError, match=rf"offset {bad_offset} of partition 1 .*not json"):
        run_backfill_round(spark, backfill)
    assert not table_exists(backfill.target), "a failed round committed to the MV"

    sim.delete_before(0, 10)  # retention dropped offsets 0..9 of partition 0
    with pytest.raises(UpstreamError, match=r"partition 0 .* no longer holds offsets 0\.\.9"):
        run_backfill_round(spark, backfill)
    assert not table_exists(backfill.target), "a failed round committed to the MV"
