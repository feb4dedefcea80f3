"""The Arrow types of Spark rows, as the engine holds them in the driver.

One definition for every module that turns a Spark schema into Arrow: timestamps are
instants in UTC (the engine's sessions run in UTC), timestamp_ntz are wall times without a
zone, exactly as Spark's own Arrow converters give them, so Arrow rows from a Parquet
file, from Spark and from a local relation compare and concatenate alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

TIME_ZONE = "UTC"


def arrow_schema_of(schema: StructType) -> pa.Schema:
    """`schema` as Arrow; raises `TypeError` or a PySpark error for a type Arrow cannot carry."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, error_on_duplicated_field_names_in_struct=True, timezone=TIME_ZONE)
