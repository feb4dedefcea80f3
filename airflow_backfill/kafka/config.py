"""Declarations of a Kafka upstream, of the source job that ingests it, and of a source backfill.

Frozen dataclasses validated on construction, like `BackfillJob`: a bad value is refused
with a message that names the field and the fix, before anything touches Kafka or Delta.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from airflow_backfill.exceptions import BackfillConfigError
from airflow_backfill.job import normalize_table_uri, validate_parallelism, validate_rate_limit
from airflow_backfill.kafka.topic import NAME, RECORD_COLUMNS, KafkaTopic

__all__ = ["RECORD_COLUMNS", "KafkaTopic"]

START_EARLIEST = "earliest"
"""Read each partition from offset 0; offsets already deleted by retention are an error."""
START_EARLIEST_AVAILABLE = "earliest_available"
"""Read each partition from the oldest offset Kafka still holds (records lost to retention are skipped)."""
_STARTS = (START_EARLIEST, START_EARLIEST_AVAILABLE)


def _name(field: str, value: Any) -> str:
    if not isinstance(value, str) or not NAME.match(value):
        raise BackfillConfigError(
            f"{field} must start with a letter and use letters, digits, '_', '.', '-' (got {value!r})."
        )
    return value


def _positive(field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BackfillConfigError(f"{field} must be a positive integer, got {value!r}.")
    return value


@dataclass(frozen=True)
class KafkaSourceJob:
    """The shared reader: ingests a topic, forward only, into an append-only Delta table."""

    name: str
    """Names the job's app transaction `airflow_backfill/source/<name>`."""
    upstream: KafkaTopic
    table: str
    """The Delta table the records are appended to (created by the first round)."""
    parallelism: int = 1
    """Spark parallelism of the source job."""
    max_records_per_round: int = 1_000_000
    """At most this many records per partition in one commit."""

    def __post_init__(self) -> None:
        _name("name", self.name)
        object.__setattr__(self, "table", normalize_table_uri("table", self.table))
        validate_parallelism("parallelism", self.parallelism)
        _positive("max_records_per_round", self.max_records_per_round)

    @property
    def app_id(self) -> str:
        return f"airflow_backfill/source/{self.name}"


@dataclass(frozen=True)
class KafkaBackfillJob:
    """A new MV over a Kafka topic that a source job already ingests into `source_table`."""

    name: str
    """Names the MV's app transaction `airflow_backfill/<name>`."""
    upstream: KafkaTopic
    source_table: str
    """The source job's Delta table (it may not exist yet)."""
    query: str
    """A Spark SQL query over `source`: per record (projection, deterministic expressions,
    WHERE) or a GROUP BY aggregate (COUNT, SUM, AVG, MIN, MAX, HAVING)."""
    target: str
    """The MV's Delta table, created by the first backfill round."""
    backfill_parallelism: int = 2
    """Spark parallelism of the backfill's Kafka reads (alterable live)."""
    rate_limit: int | None = None
    """Records per second the backfill reads from Kafka at most (None: no cap; alterable live)."""
    max_records_per_round: int = 1_000_000
    """At most this many records per partition read from Kafka in one MV commit."""
    start: str = START_EARLIEST
    """`earliest` (offsets lost to retention are an error) or `earliest_available`."""

    def __post_init__(self) -> None:
        _name("name", self.name)
        object.__setattr__(self, "source_table", normalize_table_uri("source_table", self.source_table))
        object.__setattr__(self, "target", normalize_table_uri("target", self.target))
        if self.source_table == self.target:
            raise BackfillConfigError("target must differ from source_table: the MV is a new table.")
        validate_parallelism("backfill_parallelism", self.backfill_parallelism)
        validate_rate_limit(self.rate_limit)
        _positive("max_records_per_round", self.max_records_per_round)
        if self.start not in _STARTS:
            raise BackfillConfigError(f"start must be one of {', '.join(_STARTS)}, got {self.start!r}.")
        self.check_query()

    @property
    def round_plan(self) -> str:
        """How an aggregate round writes its state and MV: always incrementally, each table
        its cheapest way. A topic's records are read once, so there is nothing to recompute
        the MV from."""
        return "incremental"

    def check_query(self) -> None:
        """Refuse a query the source backfill cannot maintain: run when the declaration is
        built, so that a bad query is an import error of the DAG file or job file that
        declares it, before any task runs."""
        validate_kafka_query(self.query)

    @property
    def app_id(self) -> str:
        return f"airflow_backfill/{self.name}"


def validate_kafka_query(query: Any) -> str:
    """Refuse what a source backfill cannot maintain: per-record queries (projections,
    deterministic expressions, WHERE) and GROUP BY aggregates are maintained."""
    if not isinstance(query, str) or not query.strip():
        raise BackfillConfigError("query must be a Spark SQL SELECT over `source`.")
    # Imported here, not at module level: the query parser loads with the first job, not
    # when provider discovery or the CLI imports this module.
    from airflow_backfill.kafka.query import aggregate_plan

    aggregate_plan(query)
    return query


@dataclass(frozen=True)
class KafkaPipeline:
    """One Kafka job file: the topic, the source job that ingests it, and the MV backfilled over it."""

    source_job: KafkaSourceJob
    backfill: KafkaBackfillJob

    @classmethod
    def from_mapping(cls, data: Any, origin: str = "job") -> KafkaPipeline:
        """Build from `{upstream: {...}, source_job: {...}, backfill: {...}}`; errors name the field."""
        if not isinstance(data, dict):
            raise BackfillConfigError(f"{origin}: a Kafka job must be a mapping with upstream, source_job, backfill.")
        unknown = sorted(set(data) - {"kind", "upstream", "source_job", "backfill"})
        missing = sorted({"upstream", "source_job", "backfill"} - set(data))
        if unknown or missing:
            raise BackfillConfigError(
                f"{origin}: unknown sections {unknown} / missing sections {missing}; "
                "a Kafka job has exactly upstream, source_job and backfill."
            )
        try:
            upstream = KafkaTopic(**{"bootstrap_servers": None, **data["upstream"]})
            source_job = KafkaSourceJob(upstream=upstream, **data["source_job"])
            backfill = KafkaBackfillJob(upstream=upstream, source_table=source_job.table, **data["backfill"])
        except TypeError as error:
            raise BackfillConfigError(f"{origin}: {error}; see the Kafka section of the README for the fields.") from None
        except BackfillConfigError as error:
            raise type(error)(f"{origin}: {error}") from None
        return cls(source_job, backfill)

    def to_mapping(self) -> dict[str, Any]:
        """The inverse of `from_mapping` (operators pass the job to spark-submit as JSON)."""
        upstream = self.source_job.upstream
        return {
            "kind": "kafka",
            "upstream": {"bootstrap_servers": upstream.bootstrap_servers, "kafka_conn_id": upstream.kafka_conn_id,
                         "topic": upstream.topic, "value_schema": upstream.value_schema},
            "source_job": {"name": self.source_job.name, "table": self.source_job.table,
                           "parallelism": self.source_job.parallelism,
                           "max_records_per_round": self.source_job.max_records_per_round},
            "backfill": {"name": self.backfill.name, "query": self.backfill.query, "target": self.backfill.target,
                         "backfill_parallelism": self.backfill.backfill_parallelism,
                         "rate_limit": self.backfill.rate_limit,
                         "max_records_per_round": self.backfill.max_records_per_round,
                         "start": self.backfill.start},
        }


def load_kafka_pipeline(path: str) -> KafkaPipeline:
    """Read a Kafka job file (YAML)."""
    import yaml

    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
    except FileNotFoundError:
        raise BackfillConfigError(f"job file {path} does not exist; pass the path of a Kafka job file.") from None
    return KafkaPipeline.from_mapping(data, origin=f"job file {path}")
