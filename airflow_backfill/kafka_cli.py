"""`airflow-backfill kafka-status` (each partition's state, offsets and backfilled fraction)
and `airflow-backfill kafka-demo` (a loopback broker, a topic and a producer)."""

from __future__ import annotations

import argparse
import json
import os
import threading
from typing import Any

from airflow_backfill.stop_signals import request_stop_on


def add_kafka_status(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "kafka-status",
        help="show a Kafka source backfill's per-partition states and offsets",
        description="Show each partition's split state (Backfilling, SourceCachingUp, Finished), the MV's "
        "offset, the source job's committed offset, Kafka's end offset and the backfilled fraction. "
        "Reads the Delta logs and the brokers' offsets; never starts Spark.",
    )
    parser.add_argument("--job", required=True, metavar="FILE", help="the Kafka job's YAML file")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.set_defaults(run=run_kafka_status)


def run_kafka_status(args: argparse.Namespace) -> int:
    from airflow_backfill.kafka.config import load_kafka_pipeline
    from airflow_backfill.kafka.status import format_status, source_job_running, split_statuses

    job = load_kafka_pipeline(args.job).backfill
    statuses = split_statuses(job)
    if args.json:
        source_job = source_job_running(job)
        print(json.dumps({"job": job.name, "source_job": None if source_job is None else {
            "pid": source_job.pid, "host": source_job.host, "since": source_job.since,
        }, "partitions": [
            {"partition": s.partition, "state": s.state.kind, "offset": s.state.offset, "since": s.state.since,
             "source_committed": s.source_committed, "kafka_end": s.kafka_end,
             "backfilled_fraction": round(s.backfilled_fraction, 4), "waiting": s.waiting}
            for s in statuses
        ]}, sort_keys=True))
    else:
        print(format_status(job, statuses))
    return 0


def _positive_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < value <= 1_000_000:
        raise argparse.ArgumentTypeError(f"expected more than 0 and at most 1000000, got {text}")
    return value


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"expected a TCP port (1-65535), got {text!r}")
    return int(text)


def _partitions(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 64:
        raise argparse.ArgumentTypeError(f"expected 1 to 64 partitions, got {text!r}")
    return int(text)


def add_kafka_demo(subparsers: Any) -> None:
    home = os.environ.get("AIRFLOW_BACKFILL_HOME") or os.path.join(os.getcwd(), ".airflow_backfill")
    parser = subparsers.add_parser(
        "kafka-demo",
        help="start a Kafka broker on 127.0.0.1 with a topic and produce sample records",
        description="Start a single-node Kafka broker on 127.0.0.1 from the jars the install fetched, create "
        "the topic when missing and produce JSON records (id, customer, amount, kind) at a rate until "
        "Ctrl-C or SIGTERM. The broker keeps its data in --workdir, so a restart keeps the topic.",
    )
    parser.add_argument("--workdir", default=os.path.join(home, "kafka-demo"),
                        help="the broker's data folder (default: $AIRFLOW_BACKFILL_HOME/kafka-demo)")
    parser.add_argument("--port", type=_port, default=9092, help="the broker's port on 127.0.0.1 (default 9092)")
    parser.add_argument("--topic", default="orders", help="the topic (default orders)")
    parser.add_argument("--partitions", type=_partitions, default=4, help="partitions of a new topic (default 4)")
    parser.add_argument("--rate", type=_positive_number, default=50.0,
                        help="records per second over all partitions (default 50)")
    parser.add_argument("--duration", type=_positive_number, help="stop after S seconds (default: until stopped)")
    parser.set_defaults(run=run_kafka_demo)


def run_kafka_demo(args: argparse.Namespace) -> int:
    from airflow_backfill.kafka.config import KafkaTopic
    from airflow_backfill.kafka.demo import DemoSettings, run_demo
    from airflow_backfill.kafka.offsets import quiet_kafka_client
    from airflow_backfill.kafka.simulator import VALUE_SCHEMA

    quiet_kafka_client()
    KafkaTopic("127.0.0.1:1", args.topic, VALUE_SCHEMA)  # the topic name is refused here if Kafka would
    stop = threading.Event()
    request_stop_on(stop)
    run_demo(DemoSettings(workdir=os.path.abspath(args.workdir), port=args.port, topic=args.topic,
                          partitions=args.partitions, rate=args.rate, duration=args.duration), stop)
    return 0
