"""Source backfill of a Kafka topic against a plain Spark batch read of the same topic.

    python bench/kafka_backfill.py [--records 5000000] [--partitions 8] [--parallelism 2]

Starts a loopback broker, produces the records (JSON values of the simulator's schema)
over the partitions, lets the source job ingest them (not timed), then times, in one
SparkSession at the given parallelism:

- plain: `spark.read.format("kafka")` of the whole topic, decoded, the MV query, one
  Delta append, once before and once after the backfill (the mean is compared);
- backfill: `run_backfill` of the same query (per-partition offsets, split states, the
  same Delta append with its metadata), until every split is Finished.

Prints the run's JSON (both times and their ratio) and writes it into bench/results/, named by
date and commit (`bench/run_record.py`), for `python bench/table.py`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

QUERY = "SELECT id, customer, amount * 2 AS doubled, _partition, _offset FROM source WHERE kind <> 'skip'"


def produce(bootstrap: str, topic: str, records: int, partitions: int) -> None:
    """Produce `records` JSON records round-robin over the partitions, fast (no per-record acks)."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=50, batch_size=1 << 20, acks=1,
                             compression_type=None, max_request_size=8 << 20)
    kinds = ("order", "refund", "skip")
    for i in range(records):
        value = f'{{"id": {i}, "customer": "c{i % 50}", "amount": {i % 500 + 0.25}, "kind": "{kinds[i % 3]}"}}'
        producer.send(topic, value=value.encode(), key=str(i).encode(), partition=i % partitions)
    producer.flush(timeout=600)
    producer.close()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python bench/kafka_backfill.py", description=__doc__)
    parser.add_argument("--records", type=int, default=5_000_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--output", default=None,
                        help="JSON result file (default: bench/results/<date>-<time>-<commit>-kafka.json)")
    args = parser.parse_args(argv)
    from bench import run_record

    meta = run_record.run_meta("kafka", "kafka_backfill.py", argv)
    run_started = time.monotonic()
    from airflow_backfill.engine.spark_session import build_spark_session
    from airflow_backfill.kafka.config import KafkaBackfillJob, KafkaSourceJob, KafkaTopic
    from airflow_backfill.kafka.loopback_broker import LoopbackBroker
    from airflow_backfill.kafka.records import decode
    from airflow_backfill.kafka.simulator import VALUE_SCHEMA, KafkaSimulator
    from airflow_backfill.kafka.source_backfill import run_backfill
    from airflow_backfill.kafka.source_job import run_source_job

    work = Path(tempfile.mkdtemp(prefix="kafka-bench-"))
    broker = LoopbackBroker(str(work / "broker"), heap="1g").start()
    try:
        simulator = KafkaSimulator(broker.bootstrap_servers, "bench")
        simulator.create_topic(args.partitions)
        simulator.close()
        started = time.monotonic()
        produce(broker.bootstrap_servers, "bench", args.records, args.partitions)
        produce_seconds = time.monotonic() - started
        topic = KafkaTopic(broker.bootstrap_servers, "bench", VALUE_SCHEMA)
        per_partition = -(-args.records // args.partitions)
        source = KafkaSourceJob(name="bench_source", upstream=topic, table=str(work / "source"),
                                max_records_per_round=per_partition)
        backfill = KafkaBackfillJob(name="bench_mv", upstream=topic, source_table=source.table, query=QUERY,
                                    target=str(work / "mv"), backfill_parallelism=args.parallelism,
                                    max_records_per_round=per_partition)
        spark = build_spark_session("kafka-bench", args.parallelism)
        run_source_job(spark, source, max_rounds=1)

        def plain_read(target: str) -> float:
            started = time.monotonic()
            raw = (spark.read.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap_servers)
                   .option("subscribe", "bench").option("startingOffsets", "earliest")
                   .option("endingOffsets", "latest").load())
            decode(raw, topic).createOrReplaceTempView("source")
            spark.sql(QUERY).write.format("delta").mode("append").save(str(work / target))
            return time.monotonic() - started

        # The plain read runs before and after the backfill: the first run in the JVM pays
        # for warming the Kafka reader and the Delta writer, the second does not.
        plain_before = plain_read("plain-before")
        started = time.monotonic()
        backfilled = run_backfill(spark, backfill, poll_interval=0.5, timeout=3600)
        backfill_seconds = time.monotonic() - started
        plain_after = plain_read("plain-after")
        plain_seconds = (plain_before + plain_after) / 2
        rows = spark.read.format("delta").load(backfill.target).count()
        plain_rows = spark.read.format("delta").load(str(work / "plain-after")).count()
        spark.stop()
        result = {
            "meta": run_record.finish_meta(meta, time.monotonic() - run_started),
            "records": args.records, "partitions": args.partitions, "parallelism": args.parallelism,
            "produce_seconds": round(produce_seconds, 1), "plain_read_seconds": [round(plain_before, 2),
                                                                                 round(plain_after, 2)],
            "plain_read_mean_s": round(plain_seconds, 2),
            "source_backfill_seconds": round(backfill_seconds, 2),
            "overhead": round(backfill_seconds / plain_seconds, 3), "rounds": backfilled.round,
            "mv_rows": rows, "plain_rows": plain_rows,
        }
        print(json.dumps(result, indent=2))
        print(f"wrote {run_record.write_result(result, args.output)}")
        return 0 if rows == plain_rows and backfilled.finished else 1
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
