"""The keyed MV changes of a small feed the driver holds, worked out in the driver.

Why: over a driver-held feed, `net_changes` and `mv_changes` still plan windows and joins
(most of a round's two thousand py4j calls) and run a Spark job to collect the result:
about 1 s of a one-row round at SF 1. The driver holds the feed's rows already; netting
them per key is a sort of at most `driver_feed.FEED_ROWS` rows, and the MV query over
the rows that survive is a projection and a filter over a local relation, which Spark's
optimizer evaluates in the driver without a job. The results are the same frames as
`net_changes` and `mv_changes` give (tests/test_driver_changes.py compares them), as
local relations. A query Spark does not evaluate locally, a key of a floating-point or
timestamp type, or an MV key whose type is not the upstream key's returns None, and the
caller takes Spark's way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_backfill.engine.delta.change_feed import (
    ARRIVING,
    CHANGE_TYPE,
    COMMIT_VERSION,
    FEED_COLUMNS,
    LEAVING,
)
from airflow_backfill.engine.delta.commits import ARRIVED, PRESENT, REPEATED_KEY
from airflow_backfill.engine.delta.driver_rows import is_local, local_relation
from airflow_backfill.engine.planning.query import QueryPlan
from airflow_backfill.engine.rounds.changes import BEFORE, CHANGE_RANK, DELETED, HELD_BEFORE, apply_query
from airflow_backfill.exceptions import BackfillError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType


_KEY_TYPES_LEFT_TO_SPARK = ("FloatType", "DoubleType", "TimestampType", "TimestampNTZType")
"""Keys Python compares otherwise than Spark: NaN equals NaN in Spark; a timestamp read
from Arrow carries its zone, one collected from Spark does not."""


class RepeatedKeyInFeed(BackfillError):
    """A key the feed shows held twice, with the message Spark's netting fails with."""


@dataclass(frozen=True)
class DriverChanges:
    """The two frames a stateless round builds from its feed, worked out by the driver."""

    net: DataFrame
    """As `net_changes` gives it, as a local relation."""
    keyed: DataFrame
    """As `mv_changes` gives it, as a local relation."""


def changes_in_driver(
    spark: SparkSession, feed: pa.Table, schema: StructType, plan: QueryPlan, *, refuse_repeated_keys: bool,
    keep_first_image: bool, arrivals: bool,
) -> DriverChanges | None:
    """The netted feed and the keyed MV changes of `feed` (rows of `schema`: upstream
    columns, `_change_type` and `_commit_version`), or None when the driver cannot work
    them out as Spark would (see the module's text). Without `arrivals` the frames carry
    no `__arrived`, as the caller drops it then. Raises `RepeatedKeyInFeed` for a key the
    feed shows held twice (under `refuse_repeated_keys`)."""
    from pyspark.sql.types import BooleanType, StructField, StructType

    upstream = StructType([field for field in schema.fields if field.name not in FEED_COLUMNS])
    if any(type(upstream[key].dataType).__name__ in _KEY_TYPES_LEFT_TO_SPARK for key in plan.upstream_key):
        return None
    flagged = refuse_repeated_keys and arrivals
    netted = _net(feed.to_pylist(), [field.name for field in upstream.fields], plan.upstream_key,
                  refuse_repeated_keys=refuse_repeated_keys)
    net_fields = [*upstream.fields, StructField(DELETED, BooleanType())]
    if flagged:
        net_fields.append(StructField(ARRIVED, BooleanType()))
    if keep_first_image:
        net_fields += [StructField(BEFORE, upstream), StructField(HELD_BEFORE, BooleanType())]
    net_schema = StructType(net_fields)
    net = _relation(spark, [{name: row[name] for name in net_schema.names} for row in netted], net_schema)
    live = _relation(spark, [row for row in netted if not row[DELETED]], upstream)
    if net is None or live is None:
        return None
    new_rows = _query_rows(spark, live, plan, upstream)
    if new_rows is None:
        return None
    new, new_schema = new_rows
    held_before: set[tuple[Any, ...]] | None = None
    if keep_first_image:
        before = _relation(spark, [row[BEFORE] for row in netted if row[HELD_BEFORE]], upstream)
        held = None if before is None else _query_rows(spark, before, plan, upstream)
        if held is None:
            return None
        held_before = {_key(row, plan.mv_key) for row in held[0]}
    by_key = {_key(row, plan.mv_key): row for row in new}
    keyed_rows = []
    for row in netted:
        key = _key(row, plan.upstream_key)
        found = by_key.get(key)
        if found is None and held_before is not None and key not in held_before and not (flagged and row[ARRIVED]):
            continue  # a departure of a key the MV never held
        keyed = {**(found or dict.fromkeys(new_schema.names)), **dict(zip(plan.mv_key, key, strict=True)),
                 PRESENT: True if found is not None else None}
        if flagged:
            keyed[ARRIVED] = row[ARRIVED]
        keyed_rows.append(keyed)
    key_fields = {mv: upstream[name] for name, mv in zip(plan.upstream_key, plan.mv_key, strict=True)}
    keyed_schema = StructType([
        StructField(field.name, key_fields[field.name].dataType, key_fields[field.name].nullable)
        if field.name in key_fields else StructField(field.name, field.dataType, True)
        for field in new_schema.fields
    ] + [StructField(PRESENT, BooleanType())] + ([StructField(ARRIVED, BooleanType())] if flagged else []))
    keyed_frame = _relation(spark, keyed_rows, keyed_schema)
    return None if keyed_frame is None else DriverChanges(net, keyed_frame)


def _net(rows: list[dict[str, Any]], columns: Sequence[str], key: Sequence[str], *,
         refuse_repeated_keys: bool) -> list[dict[str, Any]]:
    """Per key, its latest image with `__deleted`, `__arrived`, `__before` and
    `__held_before`, as `net_changes` computes them over its window (newest commit first,
    then the image that survives a commit first)."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(_key(row, key), []).append(row)
    netted = []
    for key_values, group in groups.items():
        group.sort(key=_latest_first)
        signs = [1 if row[CHANGE_TYPE] in ARRIVING else -1 for row in group]
        total = sum(signs)
        befores, after = [], 0
        for sign in signs:
            after += sign
            befores.append(total - after)
        if refuse_repeated_keys and max(*befores, total) - min(*befores, total) > 1:
            raise RepeatedKeyInFeed(REPEATED_KEY + ", ".join(
                f"{column}={'NULL' if value is None else value}" for column, value in zip(key, key_values, strict=True)))
        latest, earliest = group[0], group[-1]
        netted.append({
            **{column: latest[column] for column in columns},
            DELETED: latest[CHANGE_TYPE] in LEAVING, ARRIVED: total == 1,
            BEFORE: {column: earliest[column] for column in columns}, HELD_BEFORE: earliest[CHANGE_TYPE] in LEAVING,
        })
    return netted


def _latest_first(row: dict[str, Any]) -> tuple[int, int]:
    return -int(row[COMMIT_VERSION]), -CHANGE_RANK.get(row[CHANGE_TYPE], -1)


def _relation(spark: SparkSession, rows: list[dict[str, Any]], schema: StructType) -> DataFrame | None:
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow_schema = to_arrow_schema(schema, timezone=spark.conf.get("spark.sql.session.timeZone"))
    return local_relation(spark, pa.Table.from_pylist(rows, schema=arrow_schema), schema)


def _query_rows(spark: SparkSession, rows: DataFrame, plan: QueryPlan,
                upstream: StructType) -> tuple[list[dict[str, Any]], StructType] | None:
    """The MV query's rows over `rows`, when Spark evaluates it in the driver and it keeps
    the upstream key's values and types under the MV key's names."""
    result = apply_query(spark, rows, plan.query)
    if not is_local(result):
        return None
    for name, mv in zip(plan.upstream_key, plan.mv_key, strict=True):
        if mv not in result.schema.names or result.schema[mv].dataType != upstream[name].dataType:
            return None
    return [row.asDict(recursive=True) for row in result.collect()], result.schema


def _key(row: dict[str, Any], columns: Sequence[str]) -> tuple[Any, ...]:
    return tuple(row[column] for column in columns)
