"""A GROUP BY MV over a Kafka topic, through the per-group state, with the run killed at
each of its commit points: every MV version equals the aggregate, computed here in
Python, over the produced records at or below the split offsets that version records."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder

from airflow_backfill.engine.aggregates import apply as aggregates_apply
from airflow_backfill.engine.aggregates.state import state_uri
from airflow_backfill.engine.delta.log import commit_metadata
from airflow_backfill.exceptions import UnsupportedQueryError
from airflow_backfill.kafka import aggregate, source_backfill
from airflow_backfill.kafka.config import KafkaBackfillJob, KafkaSourceJob, KafkaTopic
from airflow_backfill.kafka.positions import SPLITS_FIELD, backfill_position
from airflow_backfill.kafka.simulator import VALUE_SCHEMA, ProducedRecord
from airflow_backfill.kafka.source_backfill import run_backfill_round
from airflow_backfill.kafka.source_job import run_source_round

pytestmark = pytest.mark.spark

QUERY = (
    "SELECT customer, kind, COUNT(*) AS n, SUM(amount) AS total, AVG(amount) AS mean, MIN(amount) AS low, "
    "MAX(id) AS last_id FROM source WHERE kind <> 'skip' GROUP BY customer, kind HAVING COUNT(*) >= 2"
)
POINTS = ("before_commit", "after_state_commit", "after_commit")


class Killed(Exception):
    """Stands for a SIGKILL at a fault point: nothing after it runs."""


def expected(produced: list[ProducedRecord], offsets: dict[int, int]) -> dict[tuple, tuple]:
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for record in produced:
        if record.offset <= offsets.get(record.partition, -1) and record.value["kind"] != "skip":
            groups[(record.value["customer"], record.value["kind"])].append(record.value)
    return {
        key: (len(values), sum(v["amount"] for v in values), sum(v["amount"] for v in values) / len(values),
              min(v["amount"] for v in values), max(v["id"] for v in values))
        for key, values in groups.items() if len(values) >= 2
    }


def mv_at(target: str, version: int) -> dict[tuple, tuple]:
    table = DeltaTable(target, version=version)
    rows = pa.table(QueryBuilder().register("mv", table).execute("select * from mv").read_all()).to_pylist()
    found = {(r["customer"], r["kind"]): (r["n"], r["total"], r["mean"], r["low"], r["last_id"]) for r in rows}
    assert len(found) == len(rows), f"version {version} holds a group twice"
    return found


def same(actual: dict[tuple, tuple], wanted: dict[tuple, tuple]) -> bool:
    return actual.keys() == wanted.keys() and all(
        all(math.isclose(a, b, rel_tol=1e-9) for a, b in zip(actual[k], wanted[k], strict=True)) for k in actual
    )


def assert_every_version_exact(target: str, produced: list[ProducedRecord]) -> int:
    """Every MV commit against the aggregate at that commit's split offsets; the commits checked."""
    history = {int(entry["version"]): commit_metadata(entry) for entry in DeltaTable(target).history()}
    for version, metadata in sorted(history.items()):
        offsets = {int(p): int(s["offset"]) for p, s in metadata[SPLITS_FIELD].items()}
        assert same(mv_at(target, version), expected(produced, offsets)), f"MV version {version} at {offsets}"
    return len(history)


def test_aggregate_over_a_topic_is_exact_at_every_commit_through_kills(spark, kafka_simulator, tmp_path, monkeypatch):
    sim = kafka_simulator
    sim.create_topic(2)
    sim.produce({0: 60, 1: 30})
    topic = KafkaTopic(sim.bootstrap_servers, sim.topic, VALUE_SCHEMA)
    source = KafkaSourceJob(name="src", upstream=topic, table=str(tmp_path / "orders"))
    job = KafkaBackfillJob(name="by_customer", upstream=topic, source_table=source.table, query=QUERY,
                           target=str(tmp_path / "by_customer"), max_records_per_round=40)
    job.check_query()
    run_source_round(spark, source)                                 # committed: p0=59, p1=29
    sim.produce({0: 10, 1: 25})                                     # Kafka: p0 0..69, p1 0..54

    armed: set[str] = set()

    def crash(phase: str, point: str) -> None:
        if point in armed:
            armed.discard(point)
            raise Killed(point)

    for module in (source_backfill, aggregate, aggregates_apply):
        monkeypatch.setattr(module, "maybe_crash", crash)

    def killed_at(point: str) -> None:
        armed.add(point)
        with pytest.raises(Killed):
            run_backfill_round(spark, job)
        assert not armed

    killed_at("before_commit")                                      # round 1, nothing committed
    run_backfill_round(spark, job)                                  # round 1: created, p0 Backfilling, p1 caught up
    assert {p: str(s) for p, s in backfill_position(job.target).splits.items()} == {
        0: "Backfilling(39)", 1: "SourceCachingUp(39)"}
    killed_at("after_state_commit")                                 # round 2: state committed, MV not
    assert not run_backfill_round(spark, job).committed             # recovers the MV to round 2, then waits
    assert backfill_position(job.target).round == 2
    run_source_round(spark, source)                                 # committed: p0=69, p1=54
    killed_at("after_commit")                                       # round 3: splits Finished, committed
    assert backfill_position(job.target).finished
    sim.produce({0: 7, 1: 4})
    run_source_round(spark, source)
    assert run_backfill_round(spark, job).committed                 # Finished splits follow the source table

    position = backfill_position(job.target)
    assert position.finished and position.offsets == {0: 76, 1: 58}, position.splits
    assert assert_every_version_exact(job.target, sim.produced) == 4
    assert DeltaTable(state_uri(job.target)).transaction_version(job.app_id) == position.round == 4
    metadata = [commit_metadata(e) for e in DeltaTable(job.target).history()]
    assert any(m.get("recovered_from_state") == "true" for m in metadata), "no round was recovered from the state"


def test_count_distinct_over_a_topic_is_refused_with_the_alternatives():
    with pytest.raises(UnsupportedQueryError, match=r"COUNT\(DISTINCT .*not supported over a Kafka topic"):
        aggregate.aggregate_plan("SELECT customer, COUNT(DISTINCT kind) AS kinds FROM source GROUP BY customer")
    assert aggregate.aggregate_plan("SELECT id, amount FROM source WHERE kind <> 'skip'") is None
