"""Refuse a stateless round over an upstream whose key turned out held twice, before it commits.

Netting (`changes.net_changes`) and the MERGE keep one row per key, so a repeated key
would leave the MV wrong without a word. Each path of a round has a check that costs
what the round already reads: appended files are checked on their own, the change
feed's netting counts each key's rows, and the MERGE refuses a second row for a key the
MV holds. One case escapes them all: a query with a WHERE leaves some upstream rows out
of the MV, and a second row arriving for such a key (an insert, or an update moving a
row onto the key) has no MV row to match. For those queries the upstream itself, as of
the round's end, is asked about the keys whose rows the round grew or appended, unless
they all lie above the upstream's largest earlier key (file statistics tell, without
reading data).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from airflow_backfill.engine.delta.commits import ARRIVED
from airflow_backfill.engine.delta.driver_rows import arrow_of, arrow_rows
from airflow_backfill.engine.delta.key_range import (
    KeyRange,
    all_above,
    boundable,
    changes_key_range,
    table_key_max,
)
from airflow_backfill.engine.delta.keyed_rows import find_rows
from airflow_backfill.engine.delta.log import arrow_schema, load_table
from airflow_backfill.engine.delta.log_state import table_state
from airflow_backfill.engine.planning.aggregate_sql import quote
from airflow_backfill.engine.rounds.changes import duplicate_key
from airflow_backfill.engine.sizes import sizes
from airflow_backfill.exceptions import RepeatedKeyError
from airflow_backfill.storage.files import read_parquet_columns

if TYPE_CHECKING:

    from pyspark.sql import DataFrame, SparkSession

    from airflow_backfill.engine.delta.appends import AppendedFiles
    from airflow_backfill.engine.planning.query import QueryPlan
    from airflow_backfill.job import BackfillJob

log = logging.getLogger(__name__)

def refuse_repeated_appended_keys(
    spark: SparkSession, job: BackfillJob, plan: QueryPlan, appended: AppendedFiles, watermark: int,
    appended_rows: DataFrame,
) -> None:
    """Each upstream key the range appended (`appended_rows`, read from `appended`'s files)
    must be held once; skipped under `verify_primary_key: false`.

    The added rows alone tell when no earlier row can hold their keys: the query keeps
    every upstream row (the keys lie above the MV's), or they lie above the upstream's
    largest key at the watermark (file statistics). Their key columns then prove them, as
    the snapshot proves its rows: read on the driver when the files hold at most
    `sizes.key_check_rows` rows (a forward epoch's few thousand keys, without a Spark
    job), else by one small Spark job. Otherwise a query with a WHERE may have left an
    earlier row of the key out of the MV: the upstream is read over the added keys' range.
    """
    if not appended.paths or not job.verify_primary_key:
        return
    if plan.filters_rows and not all_above(appended.keys, _largest_key_at(job, appended.keys.column, watermark)):
        keys = _appended_keys(job, plan, appended)
        if keys is None or not refused_by_driver(job, plan, appended.end_version, keys):
            refuse_keys_held_twice(spark, job, plan, appended.end_version, appended.keys)
        return
    if appended.keys.present_rows <= sizes().key_check_rows:
        duplicate = _repeated_in_files(appended.paths, _file_columns(job, plan.upstream_key))
    else:
        duplicate = duplicate_key(appended_rows, plan.upstream_key)
    if duplicate is not None:
        raise RepeatedKeyError(list(job.primary_key), job.source, held_times(*duplicate, appended.end_version))


def _file_columns(job: BackfillJob, key: tuple[str, ...]) -> list[str]:
    """The key columns as the upstream's files name them (Spark matches names regardless of case)."""
    names = {name.lower(): name for name in arrow_schema(load_table(job.source)).names}
    return [names.get(column.lower(), column) for column in key]


def _repeated_in_files(paths: tuple[str, ...], columns: list[str]) -> tuple[dict, int] | None:
    """One key the files' rows hold more than once, with its count (NULL keys group
    together, as in Spark); None when each is held once."""
    import pyarrow.compute as pc

    keys = pa.concat_tables(read_parquet_columns(path, columns) for path in paths)
    counts = keys.group_by(columns).aggregate([([], "count_all")])
    repeated = counts.filter(pc.greater(counts.column("count_all"), 1))
    if not repeated.num_rows:
        return None
    found = repeated.slice(0, 1).to_pylist()[0]
    return found, int(found.pop("count_all"))


def refuse_arrived_keys_held_twice(
    spark: SparkSession, job: BackfillJob, plan: QueryPlan, net: DataFrame, watermark: int, version: int,
) -> None:
    """No key whose rows grew over the range (watermark, version] may be held twice by the
    upstream at `version`.

    `net` is the round's netted changes with `__arrived` (`net_changes` under the key
    check): an insert, or an update that moved a row onto another key, grows that key's
    rows; only such keys can be held twice at the end of a range that starts with each
    key held once. A query without WHERE has every upstream row in the MV, where the
    MERGE finds the first row, so the caller runs this only for queries that filter rows.

    When the driver holds `net`, the arrived keys are looked up in the upstream's files at
    `version` (`refused_by_driver`): a cost that follows the keys, whatever the upstream's
    size. Otherwise one job over `net` (cache it: the MERGE reads it next) finds the keys'
    range; the upstream is read only when some key arrived, and not even then when every
    arrived key lies above the largest key the upstream held at the watermark (file
    statistics): then every row the key ever had is in the range's feed, whose netting
    already counted them.
    """
    from pyspark.sql import functions as F

    held = _arrived_keys(net, plan)
    if held is not None and (not held.num_rows or refused_by_driver(job, plan, version, held)):
        return
    within = changes_key_range(net, plan.upstream_key[0], ARRIVED, only=ARRIVED)
    if not within.present_rows:
        return
    leading = next(f for f in net.schema.fields if f.name.lower() == plan.upstream_key[0].lower())
    if boundable(leading.dataType) and all_above(within, _largest_key_at(job, leading.name, watermark)):
        log.info("upstream keys the round added lie above the upstream's largest key at epoch %s: the "
                 "change feed holds all their rows, so the upstream is not read", watermark)
        return
    keys = net.filter(F.col(ARRIVED)).select(*(F.col(quote(c)) for c in plan.upstream_key))
    if held is None:
        held = arrow_rows(keys, sizes().lookup_keys)
        if held is not None and refused_by_driver(job, plan, version, held):
            return
    refuse_keys_held_twice(spark, job, plan, version, within, keys)


def _arrived_keys(net: DataFrame, plan: QueryPlan) -> pa.Table | None:
    """The arrived keys of netted changes the driver holds, without a Spark job."""
    rows = arrow_of(net)
    if rows is None:
        return None
    names = {name.lower(): name for name in rows.column_names}
    arrived = rows.filter(pc.fill_null(rows.column(names[ARRIVED.lower()]), False))
    return arrived.select([names[column.lower()] for column in plan.upstream_key])


def refused_by_driver(job: BackfillJob, plan: QueryPlan, version: int, keys: pa.Table) -> bool:
    """Whether the driver looked `keys` up in the upstream as of `version` (`keyed_rows`:
    the files their statistics meet, their key columns, deletion vectors applied), raising
    for a key held twice; False when it cannot, and Spark is asked. Its cost follows the
    keys and the files they meet, not the upstream's size."""
    state = table_state(job.source, version)
    if state is None:
        return False
    columns = _file_columns(job, plan.upstream_key)
    found = find_rows(state, columns, keys.rename_columns(columns), null_safe=True)
    if found is None:
        return False
    counts = found.rows.group_by(columns, use_threads=False).aggregate([([], "count_all")])
    repeated = counts.filter(pc.greater(counts.column("count_all"), 1))
    if repeated.num_rows:
        held = repeated.slice(0, 1).to_pylist()[0]
        raise RepeatedKeyError(list(job.primary_key), job.source, held_times(held, int(held.pop("count_all")), version))
    log.info("%s upstream keys the round added looked up at epoch %s in %s of %s files (%s key values read): "
             "each is held once", keys.num_rows, version, len(found.files), len(state.files), found.scanned)
    return True


def _appended_keys(job: BackfillJob, plan: QueryPlan, appended: AppendedFiles) -> pa.Table | None:
    """The key columns of the rows the appended files hold, when few enough to look up."""
    if appended.keys.present_rows > sizes().lookup_keys:
        return None
    columns = _file_columns(job, plan.upstream_key)
    return pa.concat_tables(read_parquet_columns(path, columns) for path in appended.paths)


def refuse_keys_held_twice(
    spark: SparkSession, job: BackfillJob, plan: QueryPlan, version: int, within: KeyRange,
    keys: DataFrame | None = None,
) -> None:
    """No upstream key in the range `within` (and among `keys` when given) may be held twice
    at `version`: the upstream's key columns are read with Delta's time travel, files
    pruned by the range when the leading key is an integer or a date."""
    from pyspark.sql import functions as F

    upstream = (spark.read.format("delta").option("versionAsOf", version).load(job.source)
                .select(*(F.col(quote(c)) for c in plan.upstream_key)))
    leading = upstream.schema.fields[0]
    if boundable(leading.dataType):
        upstream = upstream.filter(within.predicate(F.col(quote(leading.name)), leading.dataType))
    if keys is not None:
        upstream = upstream.join(keys.distinct(), on=list(plan.upstream_key), how="left_semi")
    duplicate = duplicate_key(upstream, plan.upstream_key)
    if duplicate is not None:
        raise RepeatedKeyError(list(job.primary_key), job.source, held_times(*duplicate, version))
    log.info("upstream keys the round added checked at epoch %s: each is held once", version)


def _largest_key_at(job: BackfillJob, column: str, watermark: int) -> Any:
    """The upstream's largest `column` at the watermark from its file statistics; None
    (nothing known, so the upstream is asked) when that version can no longer be loaded,
    e.g. its log entries were cleaned up."""
    from deltalake.exceptions import DeltaError

    try:
        return table_key_max(job.source, column, watermark)
    except DeltaError as error:
        log.info("the upstream at epoch %s cannot be loaded (%s): its keys are looked up instead", watermark, error)
        return None


def held_times(key: dict, count: int, version: int) -> str:
    """How a refusal names a key the upstream holds more than once: `order_id=7 is held 2
    times at epoch 12`."""
    held = ", ".join(f"{column}={value}" for column, value in key.items())
    return f"{held} is held {count} times at epoch {version}"
