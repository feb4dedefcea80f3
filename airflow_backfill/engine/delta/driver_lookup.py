"""The rows of a Delta table whose columns equal one of a few keys, read by the driver, in
the types Spark gives them.

Why: a join round extends each table's changed rows with the rows the other tables hold
at the same join keys. Spark reads those through Delta: planning each scan runs Delta's
file skipping and deletion-vector lookups as jobs, and again whenever the plan holding
it is cached, persisted or collected (about 1.5 s of a TPC-H Q3 round at SF 1 that looks
up a few thousand keys, docs/benchmarks.md). The keys are few, so the driver reads the
matching rows itself (`keyed_rows`: the files and row groups whose statistics leave room
for a key, their key columns, deletion vectors applied) and casts them to the Arrow types
of the table's Spark schema. Anything `keyed_rows` does not read returns None and the
caller reads through Spark.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from airflow_backfill.engine.delta.arrow_types import arrow_schema_of
from airflow_backfill.engine.delta.keyed_rows import find_rows
from airflow_backfill.engine.delta.log import spark_schema, table_at
from airflow_backfill.engine.delta.log_state import table_state

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)


def lookup_rows(uri: str, version: int, columns: Sequence[str], key_columns: Sequence[str],
                keys: pa.Table) -> tuple[pa.Table, StructType] | None:
    """The rows of the table at `uri` as of `version` whose `key_columns` equal a row of
    `keys` (same order; NULL never equals), as Arrow of the table's `columns` and their
    Spark schema, or None when the driver does not read them (see the module's text)."""
    import pyarrow as pa
    from pyspark.sql.types import StructType

    state = table_state(uri, version)
    if state is None:
        return None
    schema = spark_schema(table_at(uri, version))
    names = {name.lower(): name for name in schema.names}
    if any(c.lower() not in names for c in [*columns, *key_columns]):
        return None
    columns = [names[c.lower()] for c in columns]
    key_columns = [names[c.lower()] for c in key_columns]
    wanted_schema = StructType([next(f for f in schema.fields if f.name == c) for c in columns])
    target = _arrow_types(wanted_schema, columns)
    key_types = _arrow_types(schema, key_columns)
    if target is None or key_types is None or not all(_searchable(f.type) for f in key_types):
        return None
    try:
        wanted = pa.table([keys.column(i).cast(f.type) for i, f in enumerate(key_types)], schema=key_types)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    found = find_rows(state, key_columns, wanted, columns)
    if found is None:
        return None
    try:
        rows = pa.table([found.rows.column(c).cast(f.type) for c, f in zip(columns, target, strict=True)],
                        schema=target)
    except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
        log.info("lookup in %s left to Spark: %s", uri, error)
        return None
    return rows, wanted_schema


def _arrow_types(schema: StructType, columns: Sequence[str]) -> pa.Schema | None:
    """The Arrow schema Spark's local relation takes for `columns`, or None when Arrow
    cannot carry one of their types."""
    from pyspark.errors import PySparkException
    from pyspark.sql.types import StructType

    fields = {field.name: field for field in schema.fields}
    try:
        return arrow_schema_of(StructType([fields[c] for c in columns]))
    except (PySparkException, TypeError):
        return None


def _searchable(data_type: pa.DataType) -> bool:
    """Types whose statistics and values compare exactly in Python (no time zones, no NaN)."""
    import pyarrow as pa

    return (pa.types.is_integer(data_type) or pa.types.is_string(data_type) or pa.types.is_date32(data_type)
            or pa.types.is_decimal(data_type))
