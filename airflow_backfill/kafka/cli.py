"""`airflow-backfill kafka-status`: each partition's state, offsets and backfilled fraction."""

from __future__ import annotations

import argparse
import json
from typing import Any


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
    from airflow_backfill.kafka.status import format_status, split_statuses

    job = load_kafka_pipeline(args.job).backfill
    statuses = split_statuses(job)
    if args.json:
        print(json.dumps({"job": job.name, "partitions": [
            {"partition": s.partition, "state": s.state.kind, "offset": s.state.offset,
             "source_committed": s.source_committed, "kafka_end": s.kafka_end,
             "backfilled_fraction": round(s.backfilled_fraction, 4)}
            for s in statuses
        ]}, sort_keys=True))
    else:
        print(format_status(job, statuses))
    return 0
