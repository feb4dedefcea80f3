"""`airflow-backfill jars fetch` (the pinned jars, resolved once with Maven into the provider's
cache) and `airflow-backfill jars conf` (the Spark settings that load them, as
spark-defaults.conf lines, for a `spark-submit` run by hand or a Spark image)."""

from __future__ import annotations

import argparse
from typing import Any


def add_jars(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "jars",
        help="fetch the pinned Delta Lake, Kafka connector and S3A jars once, or print the Spark settings that load them",
        description="The jars Spark needs besides pyspark's are Maven coordinates pinned in the provider's poms "
        "(Delta Lake and Spark's Kafka connector, Hadoop's S3A, and Apache Kafka's broker for the demo). `fetch` "
        "resolves them once with Maven into the provider's cache ([airflow_backfill] cache_dir, or the folders "
        "jars_dir, s3a_jars_dir and kafka_broker_jars name); a folder already fetched for the same pins is left "
        "as it is. Nothing is resolved when Spark runs.",
    )
    actions = parser.add_subparsers(dest="jars_action", metavar="ACTION", required=True)
    fetch = actions.add_parser("fetch", help="resolve the pinned jars with Maven (needs mvn and network access once)")
    fetch.add_argument("--kafka-broker", action="store_true",
                       help="also Apache Kafka's broker jars (`airflow-backfill kafka-demo`, the tests)")
    fetch.add_argument("--no-s3a", action="store_true", help="leave out Hadoop's S3A jars (no tables on S3)")
    fetch.add_argument("--force", action="store_true", help="fetch again even when the folders are up to date")
    fetch.add_argument("--check", action="store_true",
                       help="fetch nothing: exit 1 when a folder is missing or was fetched for other pins")
    fetch.set_defaults(run=run_jars_fetch)
    conf = actions.add_parser("conf", help="print the Spark settings that load the jars, as spark-defaults.conf lines")
    conf.set_defaults(run=run_jars_conf)


def run_jars_fetch(args: argparse.Namespace) -> int:
    from airflow_backfill.jvm.fetch import fetch
    from airflow_backfill.jvm.libraries import KAFKA_BROKER, S3A, SPARK

    sets = [SPARK, *([] if args.no_s3a else [S3A]), *([KAFKA_BROKER] if args.kafka_broker else [])]
    if args.check:
        stale = [jar_set for jar_set in sets if (folder := jar_set.folder()) is not None
                 and not jar_set.is_current(folder)]
        for jar_set in stale:
            print(f"{jar_set.name}: {jar_set.folder()} is missing or was fetched for other pins")
        return 1 if stale else 0
    for jar_set in sets:
        print(fetch(jar_set, force=args.force))
    return 0


def run_jars_conf(args: argparse.Namespace) -> int:
    from airflow_backfill.engine.delta.jars import delta_spark_conf

    for key, value in delta_spark_conf().items():
        print(key, value)
    return 0
