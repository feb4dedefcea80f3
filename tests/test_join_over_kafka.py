"""A join whose upstream is a Kafka source job's table: the source job's rounds are its
epochs, joined with a Delta table of customers that changes too. Every MV commit is
checked against the query over both upstreams as of the versions it records."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from airflow_backfill.engine.delta.log import CDF_PROPERTY
from airflow_backfill.engine.phases.catch_up import run_catch_up
from airflow_backfill.engine.phases.snapshot import run_snapshot
from airflow_backfill.job import BackfillJob
from airflow_backfill.kafka.config import KafkaSourceJob, KafkaTopic
from airflow_backfill.kafka.simulator import VALUE_SCHEMA
from airflow_backfill.kafka.source_job import run_source_round
from oracle import assert_every_join_commit_matches

pytestmark = pytest.mark.spark

QUERY = ("SELECT o._partition, o._offset, o.amount, c.region FROM orders o "
         "JOIN customers c ON o.customer = c.name WHERE o.kind <> 'skip'")


def _customers(uri: str) -> None:
    """Customers c0..c39 (the simulator draws c0..c49, so some orders find none)."""
    rows = pa.table({"name": [f"c{i}" for i in range(40)], "region": [f"r{i % 4}" for i in range(40)]})
    write_deltalake(uri, rows, configuration={CDF_PROPERTY: "true"})


def test_a_join_follows_a_kafka_source_tables_rounds(spark, kafka_simulator, tmp_path: Path):
    sim = kafka_simulator
    sim.create_topic(2)
    sim.produce({0: 60, 1: 40})
    source = KafkaSourceJob(name="orders_source", upstream=KafkaTopic(sim.bootstrap_servers, sim.topic, VALUE_SCHEMA),
                            table=str(tmp_path / "orders"), max_records_per_round=10_000)
    run_source_round(spark, source)
    assert DeltaTable(source.table).metadata().configuration.get(CDF_PROPERTY) == "true"
    customers = str(tmp_path / "customers")
    _customers(customers)
    job = BackfillJob(name="orders_by_region", target=str(tmp_path / "mv"), query=QUERY, lag_threshold=0,
                      backfill_parallelism=2, parallelism=1, round_plan="incremental", sources={
                          "orders": {"table": source.table, "primary_key": ["_partition", "_offset"]},
                          "customers": {"table": customers, "primary_key": ["name"]},
                      })
    run_snapshot(spark, job)

    sim.produce({0: 25, 1: 35})
    run_source_round(spark, source)
    table = DeltaTable(customers)
    table.update(updates={"region": "'moved'"}, predicate="name IN ('c1', 'c2')")
    table.delete("name = 'c3'")
    write_deltalake(customers, pa.table({"name": ["c45", "c46"], "region": ["new", "new"]}), mode="append")
    run_catch_up(spark, job)
    sim.produce({0: 10})
    run_source_round(spark, source)
    run_catch_up(spark, job)

    vectors = assert_every_join_commit_matches({"orders": source.table, "customers": customers}, job.target,
                                               QUERY, job.app_id, key=["_partition", "_offset"])
    assert vectors[-1] == {"orders": DeltaTable(source.table).version(), "customers": DeltaTable(customers).version()}
    assert len(vectors) >= 2, vectors
