"""A recomputed table written as its difference with the table it replaces.

Why: an overwrite's change feed shows every old row deleted and every new row inserted,
so each MV over this one (and any reader of its feed) sees the whole table change,
however little did. Comparing the recomputed rows with the table's in one join by key
gives the keyed changes that turn one into the other (a key's new row when it is new or
differs in some column, its departure when it is gone); written through the keyed writes
(`rounds/write.py`), with the watermark in one commit, they make a feed of about
two rows per changed row.

Rows are compared exactly, value for value: Spark's `<=>` takes -0.0 as 0.0, a string of
a case-blind collation as its other case, and compares no map or variant at all, so each
column is compared by `same_value`, which keeps such values apart (NaN equals NaN, as in
Spark's own comparisons and in the engine's netting).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from airflow_backfill.engine.delta.commits import PRESENT
from airflow_backfill.engine.delta.listed_files import read_table
from airflow_backfill.engine.planning.aggregate_sql import quote
from airflow_backfill.engine.planning.round_plan import DIFFERENCE_WAYS, cheapest
from airflow_backfill.engine.rounds.exact_values import all_of, same_value
from airflow_backfill.engine.rounds.write import prepare, write

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from airflow_backfill.engine.rounds.write import PreparedChanges

log = logging.getLogger(__name__)

_OLD, _NEW, _IN_OLD, _IN_NEW = "__old", "__new", "__in_old", "__in_new"


def keyed_difference(current: DataFrame, recomputed: DataFrame, key: Sequence[str]) -> DataFrame:
    """Keyed changes (`__present`) that turn `current` into `recomputed`, both of the same
    columns and types, each holding a key once: the new row of a key that is new or differs
    in some column (`same_value`), the key alone of one that is gone. A key's rows that are
    equal in every column give no change. One full outer join, NULL-safe on the key."""
    from pyspark.sql import functions as F

    fields = recomputed.schema.fields

    def side(alias: str, name: str) -> Column:
        return F.col(f"{alias}.{quote(name)}")

    old = current.select(*(quote(f.name) for f in fields)).withColumn(_IN_OLD, F.lit(True)).alias(_OLD)
    new = recomputed.withColumn(_IN_NEW, F.lit(True)).alias(_NEW)
    joined = old.join(new, on=[side(_OLD, k).eqNullSafe(side(_NEW, k)) for k in key], how="full_outer")
    in_old, in_new = side(_OLD, _IN_OLD).isNotNull(), side(_NEW, _IN_NEW).isNotNull()
    same = all_of([same_value(side(_OLD, f.name), side(_NEW, f.name), f.dataType) for f in fields])
    keys = {k.lower() for k in key}
    return joined.filter(~(in_old & in_new & same)).select(
        *(F.when(in_new, side(_NEW, f.name)).otherwise(
            side(_OLD, f.name) if f.name.lower() in keys else F.lit(None).cast(f.dataType)).alias(f.name)
          for f in fields),
        F.when(in_new, F.lit(True)).otherwise(F.lit(None).cast("boolean")).alias(PRESENT),
    )


def write_difference(
    spark: SparkSession, uri: str, recomputed: DataFrame, key: Sequence[str], *, app_id: str, version: int,
    user_metadata: str, estimates: Callable[[PreparedChanges], Mapping[str, float]],
    before_commit: Callable[[], None] | None = None,
) -> tuple[str, int]:
    """Commit to the table at `uri` only the rows of `recomputed` (its whole new content,
    conformed to its types) that differ from its rows now, with the watermark, in one
    commit, by the cheapest of `DIFFERENCE_WAYS` that `estimates(prepared changes)` offers
    (seconds per way). `before_commit` runs before the commit (before anything is
    written). Returns (the way taken, the changed keys written)."""
    changes = keyed_difference(read_table(spark, uri), recomputed, key)
    prepared = prepare(spark, uri, changes, key, null_safe=True)
    try:
        ways = {way: seconds for way, seconds in estimates(prepared).items() if way in DIFFERENCE_WAYS}
        way = cheapest(ways)
        log.info("the recomputed rows differ from %s in %s keys (%s new rows): %s", uri, prepared.changed.rows,
                 prepared.changed.present_rows, way)
        written = write(spark, prepared, way, app_id=app_id, version=version, user_metadata=user_metadata,
                        before_commit=before_commit)
        return way, written
    finally:
        prepared.release()
