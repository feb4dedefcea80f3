"""Arguments shared by the Kafka spark-submit entry points: the job file or its JSON."""

from __future__ import annotations

import argparse
import base64
import json

from airflow_backfill.exceptions import BackfillConfigError
from airflow_backfill.kafka.config import KafkaPipeline, load_kafka_pipeline


def pipeline_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--job", help="path of a Kafka job file (YAML)")
    source.add_argument("--job-b64", help="the job as base64-encoded JSON (what the operators pass)")


def resolve_pipeline(args: argparse.Namespace) -> KafkaPipeline:
    if args.job:
        return load_kafka_pipeline(args.job)
    try:
        data = json.loads(base64.b64decode(args.job_b64).decode())
    except ValueError as error:
        raise BackfillConfigError(f"--job-b64 is not base64-encoded JSON: {error}") from None
    pipeline = KafkaPipeline.from_mapping(data, origin="--job-b64")
    pipeline.backfill.check_query()
    return pipeline
