"""Apply a range of upstream epochs to the MV in one commit (catch-up and forward).

One epoch range travels downwards: its change rows are read from the upstream's log
store by Spark (only the columns the query needs); for a stateless query they are netted
per upstream key, mapped through the MV query and merged into the MV by Delta's MERGE
together with the new watermark; an aggregate folds them into its per-group state first
(`aggregate_apply`). A stateless range that only appended rows above the MV's largest
key (told from both logs, `delta/appends.py`) skips the feed and the MERGE: the query
over the added files is appended. Every step runs on the executors. Re-running an already committed
range is a no-op: the watermark tells, and Delta skips a transaction version it has.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING

import pyarrow as pa

from airflow_backfill.engine.aggregates.apply import apply_aggregate_changes, recover_state_ahead
from airflow_backfill.engine.aggregates.state import state_uri
from airflow_backfill.engine.commit_after import commit_after
from airflow_backfill.engine.delta.appends import AppendedFiles, appended_prefix
from airflow_backfill.engine.delta.change_feed import (
    check_range_readable,
    check_schema_unchanged,
    range_inserts_rows,
    read_change_feed,
    read_upstream_as_of,
)
from airflow_backfill.engine.delta.commit_fence import at_each_commit
from airflow_backfill.engine.delta.commits import (
    ARRIVED,
    PLAN_FIELD,
    CommitInfo,
    append_new,
    commit_watermark_only,
    conform,
    overwrite,
    repeated_key_named,
)
from airflow_backfill.engine.delta.driver_feed import key_gained_rows
from airflow_backfill.engine.delta.key_proof import key_proved_from_files
from airflow_backfill.engine.delta.key_range import all_above, table_key_max, table_rows
from airflow_backfill.engine.delta.log import (
    arrow_schema,
    column_names,
    load_table,
    rows_written,
)
from airflow_backfill.engine.faults import maybe_crash
from airflow_backfill.engine.planning import aggregate_sql as sql
from airflow_backfill.engine.planning.aggregate_sql import quote
from airflow_backfill.engine.planning.query import referenced_columns
from airflow_backfill.engine.planning.round_plan import (
    APPEND,
    DIFFERENCE,
    RECOMPUTE,
    RoundPlan,
    round_estimates,
    stateless_recompute_writes,
)
from airflow_backfill.engine.rounds.applied import AppliedRange, current_watermark
from airflow_backfill.engine.rounds.changes import (
    apply_query,
    duplicate_key,
    some_key_gained_rows,
)
from airflow_backfill.engine.rounds.compact import compact_written
from airflow_backfill.engine.rounds.difference import write_difference
from airflow_backfill.engine.rounds.feed import read_feed
from airflow_backfill.engine.rounds.key_check import (
    held_times,
    refuse_arrived_keys_held_twice,
    refuse_repeated_appended_keys,
)
from airflow_backfill.engine.rounds.net import NettedRound, net_round
from airflow_backfill.engine.rounds.plan_choice import (
    describe,
    keyed_estimates,
    plan_round,
    rates_at,
    readers,
    recompute_first,
    recompute_writing,
    record_round,
    stateless_facts,
)
from airflow_backfill.engine.rounds.write import (
    PreparedChanges,
    prepare,
    refuse_arrived_keys_held,
    write,
)
from airflow_backfill.exceptions import RepeatedKeyError
from airflow_backfill.storage.spark_parquet import read_parquet_files

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from airflow_backfill.engine.planning.query import QueryPlan
    from airflow_backfill.job import BackfillJob

log = logging.getLogger(__name__)


def apply_epochs(
    spark: SparkSession,
    job: BackfillJob,
    plan: QueryPlan,
    end_version: int,
    *,
    phase: str,
    parallelism: int,
) -> AppliedRange | None:
    """Bring the MV from its watermark towards `end_version` in one commit; None when
    already there. A stateless range that starts with appends and goes on with other
    changes stops after the appends (`end_version` of the result): the caller's next
    round takes the rest."""
    started = time.monotonic()
    start = watermark = current_watermark(job)
    if plan.aggregate is not None:
        watermark = recover_state_ahead(spark, job, plan, watermark, phase=phase, parallelism=parallelism)
    if watermark >= end_version:
        log.info("MV already at watermark %s >= %s: nothing to apply", watermark, end_version)
        if watermark > start:
            return AppliedRange(start, watermark, 0, 0, time.monotonic() - started)
        return None
    check_schema_unchanged(job.source, watermark, end_version)
    spark.conf.set("spark.sql.shuffle.partitions", str(parallelism))
    info = CommitInfo(phase=phase, epoch=end_version, parallelism=parallelism, rows=0)
    if plan.aggregate is not None:
        change_rows, mv_rows_changed, chosen = apply_aggregate_changes(spark, job, plan, watermark, info)
    else:
        end_version, change_rows, mv_rows_changed, chosen = _apply_stateless(spark, job, plan, watermark, info)
    seconds = time.monotonic() - started
    record_round(job, chosen, seconds, end_version)
    compact_written(spark, _written_tables(job, plan))
    applied = AppliedRange(start, end_version, change_rows, mv_rows_changed, seconds, chosen.label)
    log.info(
        "%s: applied epochs %s..%s (%s change rows, %s MV keys, plan %s) in %.2fs",
        phase, watermark + 1, end_version, applied.change_rows, applied.mv_rows_changed, applied.plan,
        applied.seconds,
    )
    return applied


def _written_tables(job: BackfillJob, plan: QueryPlan) -> list[tuple[str, tuple[str, ...]]]:
    """The tables a round writes, each with the key its rows are sorted by."""
    written = [(job.target, plan.mv_key)]
    if plan.aggregate is not None:
        written.append((state_uri(job.target), tuple(sql.key_columns(plan.aggregate))))
    return written


def feed_columns(job: BackfillJob, plan: QueryPlan) -> list[str] | None:
    """The upstream columns a stateless round reads: the key and what the query references
    (None: all of them, for `SELECT *`). Their names come from the log the round already
    follows with delta-rs: asking Spark would rebuild the upstream's snapshot for a list
    of names."""
    referenced = referenced_columns(plan.query)
    if referenced is None:
        return None
    wanted = referenced | {column.lower() for column in plan.upstream_key}
    return column_names(job.source, wanted)


def _appended_beyond_mv(job: BackfillJob, plan: QueryPlan, watermark: int, end_version: int) -> AppendedFiles | None:
    """The files the range's append-only prefix added, when their keys all lie above the
    MV's largest key (from both tables' statistics; no data is read); else None."""
    upstream_key = _field(arrow_schema(load_table(job.source)), plan.upstream_key[0])
    mv_key = _field(arrow_schema(load_table(job.target)), plan.mv_key[0])
    if upstream_key is None or mv_key is None or not _same_bound_kind(upstream_key.type, mv_key.type):
        return None
    appended = appended_prefix(job.source, watermark, end_version, upstream_key)
    if appended is None or not all_above(appended.keys, table_key_max(job.target, mv_key.name)):
        return None
    return appended


def _append_appended(
    spark: SparkSession, job: BackfillJob, plan: QueryPlan, appended: AppendedFiles, appended_rows: DataFrame,
    watermark: int, info: CommitInfo,
) -> tuple[int, int]:
    """Append the MV query over the added files: every key is new to the MV, so no row of
    the MV is read and nothing is netted. Returns (change rows, MV rows appended)."""
    check_range_readable(job.source, watermark, info.epoch)
    change_rows = appended.keys.present_rows
    metadata = replace(info, rows=change_rows).user_metadata(job)
    target = spark.read.format("delta").load(job.target).schema
    log.info("%s: epochs %s..%s only appended %s rows above the MV's largest key: appending",
             info.phase, watermark + 1, info.epoch, change_rows)
    if not appended.paths:
        with at_each_commit(partial(maybe_crash, info.phase, "after_write")):
            commit_watermark_only(spark, job.target, app_id=job.app_id, version=info.epoch,
                                  user_metadata=metadata)
        maybe_crash(info.phase, "after_commit")
        return 0, 0
    rows = apply_query(spark, appended_rows, plan.query)
    with at_each_commit(partial(maybe_crash, info.phase, "after_write")):
        written = append_new(conform(rows, target), job.target, app_id=job.app_id, version=info.epoch,
                             user_metadata=metadata)
    maybe_crash(info.phase, "after_commit")
    return change_rows, rows_written(job.target) if written else 0


def _appended_rows(spark: SparkSession, job: BackfillJob, appended: AppendedFiles) -> DataFrame:
    """The rows of the added files (none when the range added no file, only moved the
    watermark), read with the upstream's Delta schema. Nothing is read until a job asks."""
    from pyspark.sql.pandas.types import from_arrow_schema

    schema = from_arrow_schema(arrow_schema(load_table(job.source)))
    if not appended.paths:
        return spark.createDataFrame([], schema)
    return read_parquet_files(spark, schema, appended.paths)


def _field(schema: pa.Schema, name: str) -> pa.Field | None:
    """The field called `name`, whatever its case (Spark resolves names case-insensitively)."""
    return next((field for field in schema if field.name.lower() == name.lower()), None)


def _same_bound_kind(upstream: pa.DataType, mv: pa.DataType) -> bool:
    """Both integers or both dates: the kinds whose statistics bound keys exactly."""
    return (pa.types.is_integer(upstream) and pa.types.is_integer(mv)) or (
        pa.types.is_date32(upstream) and pa.types.is_date32(mv))


def _apply_stateless(
    spark: SparkSession, job: BackfillJob, plan: QueryPlan, watermark: int, info: CommitInfo,
) -> tuple[int, int, int, RoundPlan]:
    """Net the range's changes per upstream key, map them through the query and write them
    into the MV the way the round's plan chose (or recompute the MV when that is cheaper).

    The change rows are cached and counted (the commit records them, the rate limit paces
    by them), and so are those that bring a row in: without any, no key can end the range
    held twice, and its checks are skipped; so are they when `prepare`, which counts the
    keys that arrived, finds none. The keyed MV changes are held in memory for the plan's
    estimates and the write. Returns (the version committed as the watermark, change rows
    read, MV keys changed, the plan).
    """
    appended = _appended_beyond_mv(job, plan, watermark, info.epoch)
    if appended is not None:
        appended_rows = _appended_rows(spark, job, appended)
        refuse_repeated_appended_keys(spark, job, plan, appended, watermark, appended_rows)
        if appended.end_version < info.epoch:
            log.info("%s: epochs %s..%s only appended; they are applied as a round of their own before "
                     "epochs %s..%s", info.phase, watermark + 1, appended.end_version, appended.end_version + 1,
                     info.epoch)
        chosen = RoundPlan(APPEND, {}, "the epochs only appended rows above the MV's largest key")
        info = replace(info, epoch=appended.end_version, extra={**info.extra, PLAN_FIELD: chosen.to_json()})
        return (info.epoch, *_append_appended(spark, job, plan, appended, appended_rows, watermark, info), chosen)
    early = recompute_first(job, watermark, info.epoch, info.parallelism,
                            keys=(plan.upstream_key[0], plan.mv_key[0]))
    if early is not None:  # the feed is not read; the upstream's key is proved while the MV's files are written
        proof = partial(_prove_upstream_key, spark, job, plan, watermark, info.epoch) if job.verify_primary_key else None
        return _recompute(spark, job, plan, None, 0, early, info, proof=proof)
    feed = read_feed(spark, job.source, watermark, info.epoch, feed_columns(job, plan))
    netted: NettedRound | None = None
    try:
        change_rows, arriving_rows = feed.rows or 0, feed.arriving or 0
        check_keys = job.verify_primary_key and plan.filters_rows and arriving_rows > 0
        netted = net_round(spark, job, plan, feed, key_check=check_keys)
        prepared = prepare(spark, job.target, netted.keyed, plan.mv_key,
                           null_safe=any(netted.keyed.schema[column].nullable for column in plan.mv_key),
                           table_rows=netted.mv_rows, located=netted.located, old_rows=netted.old_rows)
        try:
            if check_keys and prepared.arrived:  # prepare counted the keyed changes' arrivals
                refuse_arrived_keys_held_twice(spark, job, plan, netted.net, watermark, info.epoch)
            facts = stateless_facts(prepared, change_rows, table_rows(job.source, info.epoch),
                                    job.verify_primary_key)
            rates, feed_readers = rates_at(info.parallelism), readers(job)
            chosen = plan_round(job, round_estimates(facts, rates, feed_readers), describe(facts))
            if chosen.plan == RECOMPUTE:
                chosen = recompute_writing(chosen, stateless_recompute_writes(facts, rates, feed_readers))
                return _recompute(spark, job, plan, prepared, change_rows, chosen, info)
            return info.epoch, change_rows, _write_round(spark, job, prepared, chosen, info, change_rows), chosen
        finally:
            prepared.release()
    except Exception as error:
        repeated = repeated_key_named(error)
        if repeated is None:
            raise
        raise RepeatedKeyError(list(job.primary_key), job.source,
                               f"{repeated} is held twice between epochs {watermark + 1} and {info.epoch}") from None
    finally:
        if netted is not None:
            netted.release()
        feed.release()


def _write_round(spark: SparkSession, job: BackfillJob, prepared: PreparedChanges, chosen: RoundPlan,
                 info: CommitInfo, change_rows: int) -> int:
    """Write the round's prepared changes the way `chosen` says, with the watermark; the MV
    keys changed."""
    metadata = replace(info, rows=change_rows, extra={**info.extra, PLAN_FIELD: chosen.to_json()})
    with at_each_commit(partial(maybe_crash, info.phase, "after_write")):
        changed = write(spark, prepared, chosen.plan, app_id=job.app_id, version=info.epoch,
                        user_metadata=metadata.user_metadata(job))
    maybe_crash(info.phase, "after_commit")
    return changed


def _recompute(
    spark: SparkSession, job: BackfillJob, plan: QueryPlan, changes: DataFrame | PreparedChanges | None,
    change_rows: int, chosen: RoundPlan, info: CommitInfo, *, proof: Callable[[], None] | None = None,
) -> tuple[int, int, int, RoundPlan]:
    """Recompute the MV at the range's end instead of applying its changes. Under the key
    check, the changes whose key arrived are looked up in the MV first (with a unique key
    at the watermark, only they can make it repeated at the end), as an incremental round
    does; or `proof` (a recompute chosen before the feed) proves the upstream's key beside
    the MV's write, which commits only once it has."""
    if changes is not None and job.verify_primary_key and not plan.filters_rows:
        _refuse_arrived_in_mv(spark, job, plan, changes)
    metadata = replace(info, rows=change_rows, extra={**info.extra, PLAN_FIELD: chosen.to_json()})
    log.info("%s: recomputing the MV at epoch %s (%s)", info.phase, info.epoch, chosen.reason)
    with at_each_commit(partial(maybe_crash, info.phase, "after_write")):
        rows = recompute_stateless(spark, job, plan, info.epoch, metadata, proof=proof,
                                   difference=chosen.writes.get("mv") == DIFFERENCE)
    maybe_crash(info.phase, "after_commit")
    return info.epoch, change_rows, rows, chosen


def _prove_upstream_key(spark: SparkSession, job: BackfillJob, plan: QueryPlan, watermark: int, version: int) -> None:
    """Refuse an upstream that holds a key twice at `version`, for a recompute chosen
    before the feed (it has no arrived keys to look up).

    Every key was held at most once at the watermark. When the log shows that no commit
    of the range inserted a row, only a key whose change rows gained it rows (an UPDATE
    that moved a row to another key) can be held twice now: the feed's key columns,
    netted per key, tell, a shuffle of the change rows instead of the upstream's. Else,
    or when some key gained rows, the whole upstream's key is proved as the snapshot
    proves it: by the driver from the files when it can, else counted by Spark (the key
    columns read, one shuffle: still below the cost of the feed the recompute replaces)."""
    from pyspark.sql import functions as F

    key = list(plan.upstream_key)
    if not range_inserts_rows(job.source, watermark, version) and not _key_gained_rows(
            spark, job.source, watermark, version, key):
        log.info("epochs %s..%s inserted no row and moved none to another key: the upstream's key stays unique",
                 watermark + 1, version)
        return
    if key_proved_from_files(job.source, version, key):
        return
    keys = read_upstream_as_of(spark, job.source, version).select(*(F.col(quote(column)) for column in key))
    duplicate = duplicate_key(keys, key)
    if duplicate is not None:
        raise RepeatedKeyError(list(job.primary_key), job.source, held_times(*duplicate, version))


def _key_gained_rows(spark: SparkSession, source: str, watermark: int, version: int, key: list[str]) -> bool:
    """Whether the range leaves some key with more rows than it found: from the change files'
    key columns read by the driver when it can, else by Spark."""
    gained = key_gained_rows(source, watermark, version, key)
    if gained is None:
        gained = some_key_gained_rows(read_change_feed(spark, source, watermark, version, key), key)
    return gained


def _refuse_arrived_in_mv(
    spark: SparkSession, job: BackfillJob, plan: QueryPlan, changes: DataFrame | PreparedChanges,
) -> None:
    from pyspark.sql import functions as F

    if isinstance(changes, PreparedChanges):
        if changes.arrived:
            refuse_arrived_keys_held(spark, changes)
        return
    if ARRIVED not in changes.columns:
        return
    arrived = prepare(spark, job.target, changes.filter(F.col(ARRIVED)), plan.mv_key,
                      null_safe=any(changes.schema[column].nullable for column in plan.mv_key))
    try:
        refuse_arrived_keys_held(spark, arrived)
    finally:
        arrived.release()


def recompute_stateless(
    spark: SparkSession, job: BackfillJob, plan: QueryPlan, end_version: int, info: CommitInfo, *,
    proof: Callable[[], None] | None = None, difference: bool = False,
) -> int:
    """Overwrite the MV with the query over the upstream as of `end_version`, with the
    watermark, in one commit; returns the MV's rows. `proof`, a check that must pass before
    the commit, runs beside the write of the MV's files (`commit_after`): 0.3 s of a
    recompute at TPC-H SF 1 that no longer adds to it.

    `difference`: write only the rows that differ from the MV (`rounds/difference.py`), so
    that the MV's change feed holds about two rows per changed row for the jobs that read
    it; returns the changed keys then. The proof runs beside the comparison."""
    upstream = read_upstream_as_of(spark, job.source, end_version)
    target = spark.read.format("delta").load(job.target).schema
    rows = conform(apply_query(spark, upstream, plan.query), target)
    if difference:
        estimates = keyed_estimates(info.parallelism, readers(job))

        def write_changes(before_commit: Callable[[], None] | None) -> int:
            return write_difference(spark, job.target, rows, plan.mv_key, app_id=job.app_id, version=info.epoch,
                                    user_metadata=info.user_metadata(job), estimates=estimates,
                                    before_commit=before_commit)[1]

        return write_changes(None) if proof is None else commit_after(proof, write_changes)

    def write(before_commit: Callable[[], None] | None) -> None:
        overwrite(rows, job.target, app_id=job.app_id, version=info.epoch, user_metadata=info.user_metadata(job),
                  before_commit=before_commit)

    if proof is None:
        write(None)
    else:
        commit_after(proof, write)
    return rows_written(job.target)
