"""Open the versions an answer chose: delta-rs tables or Arrow where no JVM should start (an
Airflow task), Spark DataFrames with `versionAsOf` in a Spark job.

Each takes the answer or its plain form (the XCom a sensor pushed), so a downstream task
reads exactly the versions that agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from airflow_backfill.engine.consistency.answer import ConsistentVersions
from airflow_backfill.engine.delta.log import delta_table

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame, SparkSession

_PLAIN_TYPES = {pa.string_view(): pa.string(), pa.binary_view(): pa.binary()}


def as_answer(answer: ConsistentVersions | Mapping[str, Any]) -> ConsistentVersions:
    """The answer itself, or rebuilt from its plain form (`to_dict`)."""
    return answer if isinstance(answer, ConsistentVersions) else ConsistentVersions.from_dict(answer)


def delta_tables(answer: ConsistentVersions | Mapping[str, Any]) -> dict[str, DeltaTable]:
    """Each table as a delta-rs table loaded at its chosen version, by name."""
    chosen = as_answer(answer)
    return {name: delta_table(table.uri, table.version) for name, table in chosen.tables.items()}


def read_arrow(answer: ConsistentVersions | Mapping[str, Any], name: str, sql: str | None = None) -> pa.Table:
    """Table `name` at its chosen version as Arrow: every row, or `sql` over it (the table is
    `t` there, e.g. `SELECT customer_id, revenue FROM t WHERE revenue > 100`).

    Read through delta-rs' query engine, which applies deletion vectors; string and binary
    views come back as plain strings and binaries.
    """
    from deltalake import QueryBuilder

    chosen = as_answer(answer)
    table = delta_table(chosen.tables[name].uri, chosen.version(name))
    rows = pa.table(QueryBuilder().register("t", table).execute(sql or "SELECT * FROM t").read_all())
    schema = pa.schema([field.with_type(_PLAIN_TYPES.get(field.type, field.type)) for field in rows.schema])
    return rows.cast(schema)


def spark_dataframes(spark: SparkSession, answer: ConsistentVersions | Mapping[str, Any]) -> dict[str, DataFrame]:
    """Each table as a Spark DataFrame at its chosen version (`versionAsOf`), by name."""
    chosen = as_answer(answer)
    return {name: spark.read.format("delta").option("versionAsOf", table.version).load(table.uri)
            for name, table in chosen.tables.items()}
