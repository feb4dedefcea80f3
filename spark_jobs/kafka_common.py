"""Arguments shared by the Kafka spark-submit entry points: the job file."""

from __future__ import annotations

import argparse

from airflow_backfill.kafka.config import KafkaPipeline, load_kafka_pipeline


def pipeline_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--job", required=True, help="path of a Kafka job file (YAML or JSON; the operators write JSON)")


def resolve_pipeline(args: argparse.Namespace) -> KafkaPipeline:
    return load_kafka_pipeline(args.job)
