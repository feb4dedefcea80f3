"""The hidden per-group state of an aggregate MV: a Delta table next to the MV.

Why a separate table (`<target>/_airflow_backfill/agg_state`) rather than hidden
columns in the MV: the MV then holds exactly the query's columns and rows, so readers,
the oracle and a downstream MV (MV-on-MV) see nothing of the bookkeeping; and groups
that fail HAVING keep their state without being visible. The cost is two commits per
round instead of one, made in a fixed order:

1. the state table, with app transaction `airflow_backfill/<job>` = the new epoch;
2. the MV, with the same app transaction.

So the state's watermark is never behind the MV's. A crash between the two leaves the
state one round ahead; the next round sees it (`state watermark > MV watermark`) and
first brings the MV up to the state, recomputing the visible rows from it. Delta
ignores folders starting with `_`, so the MV's own log never lists the state's files.
Both tables are written by delta-spark only; the watermark is read with delta-rs.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from airflow_backfill.engine.delta.driver_rows import held_table
from airflow_backfill.engine.delta.keyed_rows import find_rows
from airflow_backfill.engine.delta.listed_files import read_table
from airflow_backfill.engine.delta.log import load_table, spark_schema, table_exists
from airflow_backfill.engine.delta.log_state import table_state
from airflow_backfill.engine.job_state import state_dir
from airflow_backfill.engine.planning import aggregate_sql as sql
from airflow_backfill.exceptions import TargetError
from airflow_backfill.storage import files
from airflow_backfill.storage.uri import join

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from airflow_backfill.engine.planning.aggregate_query import AggregateQuery
    from airflow_backfill.job import BackfillJob

log = logging.getLogger(__name__)

STATE_TABLE = "agg_state"


def state_uri(target: str) -> str:
    """Where the aggregate state of the MV at `target` lives."""
    return join(state_dir(target), STATE_TABLE)


def state_watermark(job: BackfillJob) -> int:
    """The state's watermark, or an error saying how to recover when the state is gone."""
    uri = state_uri(job.target)
    version = load_table(uri).transaction_version(job.app_id) if table_exists(uri) else None
    if version is None:
        raise TargetError(
            f"the aggregate state of MV {job.target} ({uri}) is missing: it is needed "
            "to maintain an aggregate. Rebuild the MV: delete the target and rerun the snapshot."
        )
    return int(version)


def discard_state(target: str) -> bool:
    """Delete a state table left by a snapshot that crashed before creating the MV."""
    uri = state_uri(target)
    if not files.delete(uri):
        return False
    log.info("removed the aggregate state of an unfinished snapshot: %s", uri)
    return True


def read_state(spark: SparkSession, job: BackfillJob, columns: list[str], *, held: bool = False) -> DataFrame:
    """The whole current state (one row per live group), checked to hold exactly `columns`.

    Pinned to the state's current version: a round reads the state and then merges into
    it, and a lazily evaluated read must never see its own round's commit. Another set of
    columns means the job's query changed since the MV was built: its state cannot be
    reused. `held`: a state of at most `sizes.held_table_rows` rows is read by the driver from
    the files its checksum lists into a local relation, so that plans over it (a round's
    fold of few changes) plan no scan of it.
    """
    uri = state_uri(job.target)
    state = _held_state(spark, uri) if held else None
    if state is None:
        state = read_table(spark, uri)
    if state.columns != columns:
        raise TargetError(
            f"the aggregate state of MV {job.target} has columns {state.columns}, but the job's query needs "
            f"{columns}: the query changed since the MV was built. Rebuild the MV (delete the target and "
            "rerun the snapshot) or restore the query it was built with."
        )
    return state


def state_rows_found(job: BackfillJob) -> bool:
    """Whether the state's rows of some groups can be looked up by the driver
    (`state_rows_of`): its log is one `log_state` follows."""
    state = table_state(state_uri(job.target))
    return state is not None and state.plain_layout


def state_rows_of(job: BackfillJob, aggregate: AggregateQuery, groups: pa.Table) -> pa.Table | None:
    """The state's rows of `groups` (its key columns `__g<i>`, NULL equal to NULL), in the
    state's columns and Arrow types, found by the driver in the files their statistics
    meet (`keyed_rows`, deletion vectors applied); None when the driver does not find them.
    Why: a round touches a few groups of a state that may hold millions; reading it whole
    costs what the state holds, a lookup what the round touched."""
    import pyarrow as pa

    from airflow_backfill.engine.delta.arrow_types import arrow_schema_of

    uri = state_uri(job.target)
    state = table_state(uri)
    if state is None:
        return None
    keys = sql.key_columns(aggregate)
    columns = [*keys, *sql.state_value_columns(aggregate)]
    found = find_rows(state, keys, groups.select(keys), columns, null_safe=True)
    if found is None:
        return None
    try:
        target = arrow_schema_of(spark_schema(load_table(uri)))
        return found.rows.select(columns).cast(pa.schema([target.field(name) for name in columns]))
    except (KeyError, TypeError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
        log.info("state rows of %s left to the whole state: %s", uri, error)
        return None


def _held_state(spark: SparkSession, uri: str) -> DataFrame | None:
    """The state's latest version as a local relation (`held_table`); the last one made is reused
    while the state stays at its version (a join round reads it for its leaving groups,
    then for the fold)."""
    table = load_table(uri)
    identity = (str(table.metadata().id), table.version())  # a rebuilt table has a new id
    made = _last_held.get(uri)
    if made is not None and made[0] == identity and made[1].sparkSession is spark:
        return made[1]
    local = held_table(spark, uri)
    _last_held.clear()
    if local is not None:
        _last_held[uri] = (identity, local)
    return local


_last_held: dict[str, tuple[tuple[str, int], DataFrame]] = {}
"""The last held state made, by its table's location: the table's id and version, and
the local relation."""
