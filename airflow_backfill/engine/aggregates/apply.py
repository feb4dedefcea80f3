"""Apply a range of upstream epochs to an aggregate MV (catch-up and forward rounds).

A round's cost follows the change, not the upstream, and every step is a Spark job on
the executors:

1. the range's change rows (only the columns the query reads) are signed, +1 arriving
   and -1 leaving, and Spark evaluates WHERE, the GROUP BY keys and the aggregate
   arguments over them, combined per touched group into a delta (`delta_sql`);
2. the old state of the touched groups is joined to the delta (the state table read
   through Delta, NULL-safe on the keys); counts and sums add up exactly; MIN/MAX keep
   the old extreme unless a removed value may have been it;
3. only the groups whose MIN/MAX may have moved, and groups with a COUNT(DISTINCT), are
   recomputed from the upstream as of the new epoch (semi-joined with the broadcast
   group keys) — a query with only COUNT, SUM and AVG never reads the upstream's files;
4. one statement gives, per touched group, its new state and the MV change it causes;
   the state is merged (groups at zero rows deleted), then the MV, both with the new
   epoch as watermark (see `aggregate_state` for why two tables and how a crash between
   the commits is recovered). Up to 10,000 touched groups are held by the driver
   (`driver_rows`): the checks, key ranges and write plans over them then run no job.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING

from airflow_backfill.engine.aggregates.driver_fold import touched_in_driver
from airflow_backfill.engine.aggregates.group_rows import recomputed_groups
from airflow_backfill.engine.aggregates.state import (
    read_state,
    state_rows_found,
    state_rows_of,
    state_uri,
    state_watermark,
)
from airflow_backfill.engine.aggregates.view import cast_to, mv_changes, value_types, visible_rows
from airflow_backfill.engine.commit_after import commit_after
from airflow_backfill.engine.delta.change_feed import FEED_COLUMNS, read_upstream_as_of
from airflow_backfill.engine.delta.commit_fence import at_each_commit
from airflow_backfill.engine.delta.commits import (
    PLAN_FIELD,
    PRESENT,
    CommitInfo,
    commit_watermark_only,
    overwrite,
)
from airflow_backfill.engine.delta.driver_rows import (
    arrow_of,
    held_in_driver,
    held_whole,
    is_local,
    local_arrow,
    local_relation,
)
from airflow_backfill.engine.delta.key_range import table_rows
from airflow_backfill.engine.delta.listed_files import read_table
from airflow_backfill.engine.delta.log import column_names, load_table, rows_written, spark_schema
from airflow_backfill.engine.faults import maybe_crash
from airflow_backfill.engine.planning import aggregate_sql as sql
from airflow_backfill.engine.planning.round_plan import (
    DIFFERENCE,
    OVERWRITE,
    RECOMPUTE,
    WATERMARK_ONLY,
    RoundPlan,
    aggregate_recompute_writes,
    aggregate_round_estimates,
    allowed_mv_ways,
)
from airflow_backfill.engine.rounds.changes import signed_rows
from airflow_backfill.engine.rounds.difference import write_difference
from airflow_backfill.engine.rounds.feed import read_feed
from airflow_backfill.engine.rounds.plan_choice import (
    keyed_estimates,
    plan_round,
    rates_at,
    readers,
    recompute_first,
    recompute_writing,
)
from airflow_backfill.engine.rounds.write import prepare, write, write_keyed
from airflow_backfill.engine.sizes import sizes
from airflow_backfill.exceptions import TargetError

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from airflow_backfill.engine.planning.aggregate_query import AggregateQuery
    from airflow_backfill.engine.planning.query import QueryPlan
    from airflow_backfill.engine.rounds.write import PreparedChanges
    from airflow_backfill.job import BackfillJob

log = logging.getLogger(__name__)

_FLAGS = (sql.EXISTED, sql.RECOMPUTE)

_CHANGES, _TOUCHED, _NEW, _KEYS, _RECOMPUTED = (
    "__airflow_backfill_changes", "__airflow_backfill_touched", "__airflow_backfill_new",
    "__airflow_backfill_keys", "__airflow_backfill_recomputed",
)


def recover_state_ahead(
    spark: SparkSession, job: BackfillJob, plan: QueryPlan, mv_watermark: int, *, phase: str, parallelism: int
) -> int:
    """Bring the MV up to the state's watermark after a crash between their commits.

    Returns the MV's watermark afterwards. The MV rows are recomputed from the whole
    state and diffed with the whole MV (a full outer join in Spark), paid only after a crash.
    """
    watermark = state_watermark(job)
    read_state(spark, job, _state_columns(_aggregate(plan)))  # the state must fit the query
    if watermark == mv_watermark:
        return mv_watermark
    if watermark < mv_watermark:
        raise TargetError(
            f"the aggregate state of MV {job.target} is at epoch {watermark}, behind the MV's "
            f"watermark {mv_watermark}; it was changed by something else. Rebuild the MV: delete the "
            "target and rerun the snapshot."
        )
    log.warning("aggregate state is at epoch %s, the MV at %s (a run stopped between the two commits): "
                "bringing the MV up to the state", watermark, mv_watermark)
    info = CommitInfo(phase=phase, epoch=watermark, parallelism=parallelism, rows=0,
                      extra={"recovered_from_state": "true"})
    bring_mv_to_state(spark, job, plan, _upstream_struct(spark, job.source, watermark), info)
    return watermark


def bring_mv_to_state(spark: SparkSession, job: BackfillJob, plan: QueryPlan, upstream: StructType,
                      info: CommitInfo) -> None:
    """Commit the MV rows the whole state gives (`upstream`: the schema of the query's
    `source`), as their difference with the MV, at `info.epoch`."""
    aggregate = _aggregate(plan)
    state = read_state(spark, job, _state_columns(aggregate))
    old_rows = read_table(spark, job.target)
    new_rows = visible_rows(spark, aggregate, state, value_types(spark, aggregate, upstream), old_rows.schema)
    changes = mv_changes(old_rows, new_rows, plan.mv_key)
    write_keyed(spark, job.target, changes, plan.mv_key, app_id=job.app_id, version=info.epoch,
                user_metadata=info.user_metadata(job), null_safe=True, round_plan=job.round_plan)


def apply_aggregate_changes(
    spark: SparkSession, job: BackfillJob, plan: QueryPlan, watermark: int, info: CommitInfo,
) -> tuple[int, int, RoundPlan]:
    """Fold the change rows of (watermark, info.epoch] into the state and the MV, or
    recompute both at info.epoch when the round's plan says that is cheaper.

    Returns (change rows read, MV rows changed, the plan).
    """
    aggregate = _aggregate(plan)
    early = recompute_first(job, watermark, info.epoch, info.parallelism, aggregate=True)
    if early is not None:
        return 0, recompute_aggregate(spark, job, plan, info, early), early
    referenced = sql.row_columns(aggregate)
    columns = column_names(job.source, referenced)
    feed = read_feed(spark, job.source, watermark, info.epoch, columns, count=False)
    signed = signed_rows(feed.frame, columns)
    if feed.rows is None:  # Spark's reader: its rows are read twice (counted, then folded)
        signed = signed.cache()
    try:
        return fold_signed_rows(spark, job, plan, signed, feed.upstream, info, recompute_at=info.epoch,
                                change_rows=feed.rows)
    finally:
        if feed.rows is None:
            signed.unpersist()


def fold_signed_rows(
    spark: SparkSession, job: BackfillJob, plan: QueryPlan, signed: DataFrame, upstream: StructType,
    info: CommitInfo, *, recompute_at: int | None, leaving_groups: DataFrame | None = None,
    change_rows: int | None = None,
) -> tuple[int, int, RoundPlan]:
    """Fold signed rows of the query's `source` (its columns, typed as in `upstream`, plus
    `__sign`) into the state and the MV, committing both at `info.epoch` through
    `commit_round` (`recompute_at`: as there; None when the query's `source` is no single
    table to recompute from, as for a join's flat relation). `leaving_groups`: state rows
    of groups whose every row leaves (a join's `leave_arrive`), subtracted whole.
    `change_rows`: the round's change rows when the caller counted them already (a join's
    netted upstream rows; changes that join nothing then fold into no group and the round
    commits only the watermarks); otherwise the signed rows and the groups are counted
    here, a job each.

    Returns (change rows folded, MV rows changed, the plan).
    """
    aggregate = _aggregate(plan)
    # Changes the driver holds take a moment: their touched groups' old state is looked up
    # (or, failing that, a small state held whole), and the groups are collected straight
    # away, with no cache to plan.
    small = is_local(signed)
    state = read_state(spark, job, _state_columns(aggregate),
                       held=small and not state_rows_found(job) and held_whole(state_uri(job.target)))
    if change_rows is None:
        change_rows = signed.count() + (leaving_groups.count() if leaving_groups is not None else 0)
    if not change_rows:
        _commit_watermarks_only(spark, job, info)
        return 0, 0, RoundPlan(WATERMARK_ONLY, {}, "the epochs changed no row the query reads")
    touched = touched_groups(spark, job, aggregate, signed, state, upstream, info.epoch, leaving_groups=leaving_groups)
    held = held_in_driver(touched, sizes().held_table_rows) if small else None  # folded again only if too many
    rows = held if held is not None else touched.cache()
    try:
        return (change_rows,
                *commit_round(spark, job, plan, aggregate, rows, replace(info, rows=change_rows),
                              recompute_at=recompute_at))
    finally:
        rows.unpersist()


def commit_round(
    spark: SparkSession, job: BackfillJob, plan: QueryPlan, aggregate: AggregateQuery, rows: DataFrame,
    info: CommitInfo, *, recompute_at: int | None,
) -> tuple[int, RoundPlan]:
    """Write the state changes, then the MV changes, of one round (`rows`: per touched group
    its new state and MV change, `touched_groups`), each the cheapest way; or recompute
    both from the upstream as of `recompute_at` when that is cheaper (None: the upstream
    cannot be read whole, as a Kafka topic's records cannot, or is no single table, as a
    join's upstreams are). Returns (MV rows changed, the plan)."""

    if not is_local(rows):
        rows = held_in_driver(rows) or rows  # the checks and both writes' plans below then run no job
    if _some_count_negative(rows):
        raise TargetError(
            f"the aggregate state of MV {job.target} went negative for some group: the state does not "
            "match the upstream's change feed. Rebuild the MV: delete the target and rerun the snapshot."
        )
    keys = sql.key_columns(aggregate)
    state = prepare(spark, state_uri(job.target), _state_changes(aggregate, rows), keys, null_safe=True)
    mv = prepare(spark, job.target, _mv_row_changes(spark, job, rows), plan.mv_key, null_safe=True)
    try:
        rates, feed_readers = rates_at(info.parallelism), readers(job)
        state_ways = state.estimates(rates)
        mv_ways = allowed_mv_ways(keyed_estimates(info.parallelism, feed_readers)(mv), job.round_plan)
        upstream = table_rows(job.source, recompute_at) if recompute_at is not None else 0
        estimates = aggregate_round_estimates(info.rows, state_ways, mv_ways, upstream, state.facts.rows,
                                              mv.facts.rows, rates, feed_readers)
        if recompute_at is None:
            estimates.pop(RECOMPUTE)
        chosen = plan_round(job, estimates, f"{info.rows} change rows, {state.changed.rows} groups touched of "
                                            f"{state.facts.rows}, {mv.facts.rows} MV rows, {feed_readers} readers")
        if chosen.plan == RECOMPUTE:
            chosen = recompute_writing(chosen, aggregate_recompute_writes(
                upstream, state.facts.rows, mv.facts.rows, mv_ways, rates, feed_readers))
            return recompute_aggregate(spark, job, plan, info, chosen), chosen
        chosen = chosen.with_writes(state=_cheapest(state_ways), mv=_cheapest(mv_ways))
        metadata = replace(info, extra={**info.extra, PLAN_FIELD: chosen.to_json()})
        with at_each_commit(partial(maybe_crash, info.phase, "after_write")):
            changed = _write_state_then_mv(spark, job, state, mv, chosen, metadata)
        maybe_crash(info.phase, "after_commit")
        return changed, chosen
    finally:
        state.release()
        mv.release()


def _some_count_negative(rows: DataFrame) -> bool:
    """Whether some touched group's row count went below zero: looked up in the rows' Arrow
    when the driver made them (`local_arrow`, no JVM call for the rows a fold just held),
    else asked of Spark."""
    import pyarrow.compute as pc
    from pyspark.sql import functions as F

    held = local_arrow(rows)
    if held is not None:
        return bool(pc.any(pc.less(held.column(sql.ROWS), 0)).as_py())
    return not rows.filter(F.col(sql.ROWS) < 0).limit(1).isEmpty()


def _write_state_then_mv(spark: SparkSession, job: BackfillJob, state: PreparedChanges, mv: PreparedChanges,
                         chosen: RoundPlan, metadata: CommitInfo) -> int:
    """Commit the state's changes, then the MV's (a crash between the two is recovered from
    the state). An overwritten state too large for the driver to write is written beside
    the MV's files, the MV committing once the state has (`commit_after`: Spark's jobs for
    both overlap). A smaller one, which the driver writes without a job, is simply written
    first: the thread would cost more than it overlaps (a py4j connection and a JVM thread
    each round, 8 % of a small aggregate's round's CPU). Returns the MV rows changed."""
    applied = (load_table(state.uri).transaction_version(job.app_id) or -1) >= metadata.epoch
    groups = 0 if applied else state.changed.rows or 0
    mv_metadata = replace(metadata, extra={**metadata.extra, "groups_changed": str(groups)}).user_metadata(job)

    def write_state() -> None:
        write(spark, state, chosen.writes["state"], app_id=job.app_id, version=metadata.epoch,
              user_metadata=metadata.user_metadata(job), fed=False)  # nothing reads the state's feed

    def write_mv(before_commit: Callable[[], None] | None) -> int:
        return write(spark, mv, chosen.writes["mv"], app_id=job.app_id, version=metadata.epoch,
                     user_metadata=mv_metadata, before_commit=before_commit)

    def after_state_commit() -> None:
        maybe_crash(metadata.phase, "after_state_commit")

    if chosen.writes["state"] != OVERWRITE or state.facts.rows <= sizes().held_table_rows:
        write_state()
        after_state_commit()
        return write_mv(None)
    return commit_after(write_state, write_mv, after_state_commit)


def _cheapest(estimates: dict[str, float]) -> str:
    return min(estimates, key=lambda way: (estimates[way], way))


def recompute_aggregate(spark: SparkSession, job: BackfillJob, plan: QueryPlan, info: CommitInfo,
                        chosen: RoundPlan, upstream: DataFrame | None = None) -> int:
    """Recompute the state from the upstream as of info.epoch (or from `upstream`, the
    query's `source` rows, as a join's flat relation at its vector) and overwrite the
    state, then the MV, with it (the same order and watermark as an incremental round, so
    a crash between the two is recovered the same way). Returns the MV's rows; or, when
    the plan writes the MV's difference (`writes`: `mv` `difference`, for an MV whose feed
    jobs read), only the MV rows that differ, and the changed keys."""
    aggregate = _aggregate(plan)
    if upstream is None:
        upstream = read_upstream_as_of(spark, job.source, info.epoch)
    upstream.createOrReplaceTempView("source")
    state_schema = read_state(spark, job, _state_columns(aggregate)).schema
    state = cast_to(spark.sql(sql.state_sql(aggregate)), state_schema)
    metadata = replace(info, extra={**info.extra, PLAN_FIELD: chosen.to_json()})
    log.info("%s: recomputing the aggregate at epoch %s (%s)", info.phase, info.epoch, chosen.reason)
    with at_each_commit(partial(maybe_crash, info.phase, "after_write")):
        overwrite(state.coalesce(info.parallelism), state_uri(job.target), app_id=job.app_id, version=info.epoch,
                  user_metadata=metadata.user_metadata(job))
    maybe_crash(info.phase, "after_state_commit")
    written = read_table(spark, state_uri(job.target))
    mv_schema = spark.read.format("delta").load(job.target).schema
    mv_rows = visible_rows(spark, aggregate, written, value_types(spark, aggregate, upstream.schema), mv_schema)
    if chosen.writes.get("mv") == DIFFERENCE:  # only the MV rows that differ: its feed stays as small as the change
        _, changed = write_difference(spark, job.target, mv_rows, plan.mv_key, app_id=job.app_id, version=info.epoch,
                                      user_metadata=metadata.user_metadata(job),
                                      estimates=keyed_estimates(info.parallelism, readers(job)))
        maybe_crash(info.phase, "after_commit")
        return changed
    overwrite(mv_rows.coalesce(info.parallelism), job.target, app_id=job.app_id, version=info.epoch,
              user_metadata=metadata.user_metadata(job))
    maybe_crash(info.phase, "after_commit")
    return rows_written(job.target)


def _commit_watermarks_only(spark: SparkSession, job: BackfillJob, info: CommitInfo) -> None:
    """A range without change rows (e.g. an upstream MV's watermark-only commits): the
    state's then the MV's watermark move to the range's end, without data."""
    metadata = info.user_metadata(job)
    commit_watermark_only(spark, state_uri(job.target), app_id=job.app_id, version=info.epoch,
                          user_metadata=metadata)
    maybe_crash(info.phase, "after_state_commit")
    commit_watermark_only(spark, job.target, app_id=job.app_id, version=info.epoch, user_metadata=metadata)
    maybe_crash(info.phase, "after_commit")


def touched_groups(
    spark: SparkSession, job: BackfillJob, aggregate: AggregateQuery, signed: DataFrame, state: DataFrame,
    upstream: StructType, end_version: int, *, leaving_groups: DataFrame | None = None,
) -> DataFrame:
    """Per group the changes touch: its new state and the MV change it causes (`changes_sql`).
    `leaving_groups` (state rows; counts and sums only) are subtracted as they stand."""
    signed.createOrReplaceTempView(_CHANGES)
    widened = argument_widening(spark, aggregate, _CHANGES)
    if is_local(signed) and arrow_of(state) is None:
        state = _touched_state(spark, job, aggregate, state, leaving_groups)
    touched = touched_in_driver(spark, aggregate, _CHANGES, state, leaving_groups, widened) \
        if is_local(signed) else None
    if touched is None:
        touched = _touched_by_spark(spark, aggregate, state, leaving_groups, widened)
    touched.createOrReplaceTempView(_TOUCHED)
    state_types = [(field.name, field.dataType.simpleString()) for field in state.schema.fields]
    carried = (*_FLAGS, *sql.old_columns(aggregate))
    with exact_decimal_sums(spark):
        new = spark.sql(f"SELECT {', '.join(sql.cast_expressions(state_types, carried))} "
                        f"FROM ({sql.new_state_sql(aggregate, _TOUCHED)}) s")
    if aggregate.needs_recompute:
        new = _with_recomputed(spark, job, aggregate, new, end_version, state.schema, carried)
    new.createOrReplaceTempView(_NEW)
    mv = spark_schema(load_table(job.target))  # from the log: no table loaded by Spark
    types = value_types(spark, aggregate, upstream)
    mv_types = [field.dataType.simpleString() for field in mv.fields]
    return spark.sql(sql.changes_sql(aggregate, _NEW, types, mv_types))


def _touched_state(spark: SparkSession, job: BackfillJob, aggregate: AggregateQuery, state: DataFrame,
                   leaving_groups: DataFrame | None) -> DataFrame:
    """The state's rows of the groups the driver-held changes in `_CHANGES` touch (and of
    `leaving_groups`), as a local relation, when the driver finds them (`state_rows_of`);
    else `state` as it is. Why: the fold joins the touched groups with their old state, and
    a large state read whole costs what it holds where a lookup costs what the round
    touched (and a state with deletion vectors cannot be held whole)."""
    import pyarrow as pa

    keys = sql.key_columns(aggregate)
    rows = local_arrow(spark.sql(sql.row_sql(aggregate, signed=True, relation=_CHANGES)))
    leaving = None if leaving_groups is None else local_arrow(leaving_groups)
    if rows is None or (leaving_groups is not None and leaving is None):
        return state
    parts = [rows.select(keys), *([] if leaving is None else [leaving.select(keys).cast(rows.select(keys).schema)])]
    try:
        groups = pa.concat_tables(parts).group_by(keys, use_threads=False).aggregate([])
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return state
    old = state_rows_of(job, aggregate, groups)
    held = None if old is None else local_relation(spark, old, state.schema)
    return state if held is None else held


@contextmanager
def exact_decimal_sums(spark: SparkSession) -> Iterator[None]:
    """SQL analysed in the block adds decimals in the type SUM gives them. Spark types
    DECIMAL(38, s) + DECIMAL(38, s) as DECIMAL(38, s - 1) and rounds (its precision-loss
    rule), where its SUM adds in DECIMAL(38, s): an old state's sum plus a round's delta
    would lose the last digit. Analysis fixes the types, so the setting is restored once
    the statement is analysed."""
    setting = "spark.sql.decimalOperations.allowPrecisionLoss"
    before = spark.conf.get(setting) or "true"
    spark.conf.set(setting, "false")
    try:
        yield
    finally:
        spark.conf.set(setting, before)


def argument_widening(spark: SparkSession, aggregate: AggregateQuery, changes_view: str) -> frozenset[int]:
    """The arguments whose removed values a delta negates in BIGINT (`delta_parts`), from
    the types Spark gives them over the change rows (analysis only, no job)."""
    rows = spark.sql(sql.row_sql(aggregate, signed=True, relation=changes_view)).schema
    return sql.narrow_integers([rows[f"__x{j}"].dataType.simpleString() for j in range(len(aggregate.arguments))])


def _touched_by_spark(spark: SparkSession, aggregate: AggregateQuery, state: DataFrame,
                      leaving_groups: DataFrame | None, widened: frozenset[int]) -> DataFrame:
    """`touched_in_driver`'s rows computed by Spark: the delta joined NULL-safe with the old state."""
    delta = spark.sql(sql.delta_sql(aggregate, _CHANGES, widened))
    keys = sql.key_columns(aggregate)
    if leaving_groups is not None:
        delta = _minus_groups(delta, leaving_groups, keys)
    delta = delta.alias("__delta")
    old = state.select(
        *keys, *(state[c].alias(f"{sql.OLD}{c}") for c in sql.state_value_columns(aggregate))
    ).alias("__old")
    same_group = [delta[k].eqNullSafe(old[k]) for k in keys]
    return delta.join(old, on=same_group, how="left").select(
        "__delta.*", *(f"__old.`{sql.OLD}{c}`" for c in sql.state_value_columns(aggregate))
    )


def _minus_groups(delta: DataFrame, groups: DataFrame, keys: list[str]) -> DataFrame:
    """`delta` plus the negated state of `groups`, summed per group (every delta column is
    a signed sum when the aggregate has only counts and sums, and the state's value
    columns are named as the delta's)."""
    from pyspark.sql import functions as F

    values = [c for c in delta.columns if c not in keys]
    types = {field.name: field.dataType for field in delta.schema.fields}
    negated = groups.select(*keys, *((-F.col(c)).cast(types[c]).alias(c) for c in values))
    summed = delta.unionByName(negated).groupBy(*keys).agg(*(F.sum(c).alias(c) for c in values))
    return summed.select(*keys, *(F.col(c).cast(types[c]).alias(c) for c in values))


def _with_recomputed(
    spark: SparkSession, job: BackfillJob, aggregate: AggregateQuery, new: DataFrame, end_version: int,
    schema: StructType, carried: tuple[str, ...],
) -> DataFrame:
    """`new` with the MIN/MAX/COUNT(DISTINCT) of flagged groups recomputed from the upstream
    as of `end_version` (`group_rows.recomputed_groups`)."""
    new.createOrReplaceTempView(_NEW)
    keys = ", ".join(sql.key_columns(aggregate))
    flagged = spark.sql(f"SELECT {keys} FROM {_NEW} WHERE {sql.RECOMPUTE}")
    if flagged.isEmpty():  # e.g. inserts only, for MIN/MAX: the upstream is not read
        return new
    flagged.createOrReplaceTempView(_KEYS)
    recomputed_groups(spark, job.source, aggregate, _KEYS, end_version, schema).createOrReplaceTempView(_RECOMPUTED)
    recomputed = spark.sql(sql.with_recomputed_sql(aggregate, _NEW, _RECOMPUTED))
    return cast_to(recomputed, schema, keep=carried)


def _state_changes(aggregate: AggregateQuery, rows: DataFrame) -> DataFrame:
    """State rows to upsert (groups with rows) or delete (groups that had state and are now
    empty). Written as SQL text, as `_mv_row_changes`: a Column built in Python costs two
    or three JVM calls a function, a select of SQL text one call and one a column."""
    changed = rows.where(f"{sql.quote(sql.ROWS)} > 0 OR {sql.quote(sql.EXISTED)}")
    present = f"CASE WHEN {sql.quote(sql.ROWS)} > 0 THEN true END AS {sql.quote(PRESENT)}"
    return changed.selectExpr(*map(sql.quote, _state_columns(aggregate)), present)


def _mv_row_changes(spark: SparkSession, job: BackfillJob, rows: DataFrame) -> DataFrame:
    """The MV rows to upsert or delete, named as the MV (the write casts them to its types)."""
    mv = spark_schema(load_table(job.target))  # from the log: no table loaded by Spark
    change = sql.quote(sql.MV_CHANGE)
    present = f"CASE WHEN {change} = 'upsert' THEN true END AS {sql.quote(PRESENT)}"
    return rows.where(f"{change} IS NOT NULL").selectExpr(
        *(f"{sql.quote(sql.mv_column(i))} AS {sql.quote(field.name)}" for i, field in enumerate(mv.fields)), present
    )


def _state_columns(aggregate: AggregateQuery) -> list[str]:
    return [*sql.key_columns(aggregate), *sql.state_value_columns(aggregate)]


def _aggregate(plan: QueryPlan) -> AggregateQuery:
    if plan.aggregate is None:
        raise TypeError("an aggregate plan is required")
    return plan.aggregate


def _upstream_struct(spark: SparkSession, source: str, version: int) -> StructType:
    """The upstream's schema as of `version` (Delta metadata only, no data read)."""
    return spark.read.format("delta").option("versionAsOf", version).load(source).schema


def _upstream_columns(feed: DataFrame) -> StructType:
    """The upstream's columns of a change feed, as a Spark schema."""
    from pyspark.sql.types import StructType

    return StructType([field for field in feed.schema.fields if field.name not in FEED_COLUMNS])
