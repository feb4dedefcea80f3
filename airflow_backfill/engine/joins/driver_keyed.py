"""A stateless join round's keyed changes worked out by the driver, with Arrow.

Why: when a round's signed join rows and the MV rows that leave are local relations
(few changes against a small MV), Spark still evaluates `keyed_changes` as a statement
of several jobs (a GROUP BY over every column, a window per MV key: 0.3 - 0.45 s for
TPC-H Q3's line items at SF 1) for a few thousand rows. Spark's optimizer evaluates the
flat query's projection and WHERE over the local rows without a job; Arrow counts the
rows, and finds each key's arriving row, here. The result is a local relation, so the
write's plans that follow run no job either.

Rows are counted by their exact values, as `grouped_rows` counts them: a float by its
bits once every NaN is the one NaN (`one_nan`), so -0.0 stays apart from 0.0; timestamps
are their microseconds (the JVM converts the local rows to Arrow: no local time is
involved). What Arrow would not do exactly as Spark does is left to Spark (None): a
floating-point MV key (Spark's window takes -0.0 for 0.0), a NULL in the MV key (Spark's
window groups it, Arrow's join drops it), and any repeated key, whose error Spark's
evaluation raises with the key named.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from airflow_backfill.engine.delta.commits import PRESENT
from airflow_backfill.engine.delta.driver_rows import local_arrow, local_relation, one_nan
from airflow_backfill.engine.rounds.changes import SIGN

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

_COUNT, _ARRIVING = "__count", "__arriving"


def keyed_changes_in_driver(mapped: DataFrame, leaving: DataFrame | None, mv_key: tuple[str, ...]) -> DataFrame | None:
    """`keyed_changes` of the signed MV rows `mapped` (the flat query's output plus
    `__sign`) and the MV rows that leave (`leaving`, signed -1), as a local relation; None
    when the driver does not hold them all or Arrow would not count them as Spark does."""
    found = keyed_and_old_in_driver(mapped, leaving, mv_key)
    return None if found is None else found[0]


def keyed_and_old_in_driver(mapped: DataFrame, leaving: DataFrame | None,
                            mv_key: tuple[str, ...]) -> tuple[DataFrame, pa.Table] | None:
    """`keyed_changes_in_driver`, with the MV rows the changes replace or delete: the rows
    counted -1 (each changed key's old row), the old images a patch's change file holds."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyspark.sql.types import BooleanType, StructField, StructType

    columns = [name for name in mapped.columns if name != SIGN]
    if not _countable(mapped.schema, columns, mv_key):
        return None
    parts = [local_arrow(mapped)]
    if leaving is not None:
        if [(f.name, f.dataType) for f in leaving.schema.fields if f.name != SIGN] != \
                [(f.name, f.dataType) for f in mapped.schema.fields if f.name != SIGN]:
            return None
        parts.append(local_arrow(leaving.select(*mapped.columns)))
    if any(part is None for part in parts):
        return None
    try:
        target = pa.schema([field.with_nullable(True) for field in parts[0].schema])  # type: ignore[union-attr]
        signed = pa.concat_tables([part.cast(target) for part in parts if part is not None])
        counted = _counted(signed, columns)
        arriving = counted.filter(pc.greater(counted[_COUNT], 0))
        if pc.any(pc.greater(pc.abs(counted[_COUNT]), 1)).as_py() or _repeated(arriving, mv_key):
            return None  # Spark's evaluation names the repeated key
        leaving_keys = counted.filter(pc.less(counted[_COUNT], 0)).join(
            arriving.select(list(mv_key)), keys=list(mv_key), join_type="left anti")
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
        log.info("keyed changes left to Spark: %s", error)
        return None
    present = pa.concat_arrays([pa.array([True] * arriving.num_rows, pa.bool_()),
                                pa.nulls(leaving_keys.num_rows, pa.bool_())])
    rows = pa.concat_tables([arriving.select(columns), leaving_keys.select(columns)]).append_column(PRESENT, present)
    fields = {field.name: field for field in mapped.schema.fields}
    schema = StructType([*(fields[name] for name in columns), StructField(PRESENT, BooleanType(), True)])
    local = local_relation(mapped.sparkSession, rows, schema)
    old = counted.filter(pc.less(counted[_COUNT], 0)).select(columns)
    return None if local is None else (local, old)


def _countable(schema: object, columns: list[str], mv_key: tuple[str, ...]) -> bool:
    from pyspark.sql.types import DoubleType, FloatType, StructType

    assert isinstance(schema, StructType)
    return all(name in columns and not isinstance(schema[name].dataType, (DoubleType, FloatType)) for name in mv_key)


def _counted(signed: pa.Table, columns: list[str]) -> pa.Table:
    """Each distinct row with the sum of its signs, where that is not zero."""
    import pyarrow as pa
    import pyarrow.compute as pc

    signed = pa.table([*(one_nan(signed[name]) for name in columns), signed[SIGN]], names=[*columns, SIGN])
    grouped = signed.group_by(columns, use_threads=False).aggregate([(SIGN, "sum")])
    counted = grouped.select([*columns, f"{SIGN}_sum"]).rename_columns([*columns, _COUNT])
    return counted.filter(pc.not_equal(counted[_COUNT], 0))


def _repeated(arriving: pa.Table, mv_key: tuple[str, ...]) -> bool:
    """Whether some MV key has two arriving rows, or a NULL (left to Spark)."""
    import pyarrow.compute as pc

    keys = arriving.select(list(mv_key))
    if any(keys[name].null_count for name in mv_key):
        return True
    per_key = keys.group_by(list(mv_key), use_threads=False).aggregate([([], "count_all")])
    return bool(per_key.num_rows) and pc.max(per_key["count_all"]).as_py() > 1
