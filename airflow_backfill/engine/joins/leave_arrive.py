"""A round of an INNER join MV as the join rows that leave and the join rows that arrive.

When every table is INNER-joined (no row is NULL-padded) and every upstream key is unique,
a join row is fixed by the rows of its tables. Between the vectors `old` and `new`, with
D_i the rows table i lost and I_i the rows it gained (netted per row, so an update is a
lost old row and a gained new one), exactly two kinds of join row change:

    J(new) - J(old) = - {rows of J(old) holding a row of some D_i}
                      + {rows of J(new) holding a row of some I_i}

Leaving rows come from the MV itself where they can. A stateless MV at its vector is
J(old) mapped through the query, one MV row per join row, so when the MV selects table
i's key (`selected_key`) its rows with a lost key of i are exactly the leaving rows that
pass the WHERE: one scan of the MV, small next to the upstreams, with no upstream read.
An aggregate whose grouping holds table i's key (`grouped_key`: Q3 groups by the order)
has one row of i in each group, so a group with a lost key of i leaves whole: its state
row is subtracted as it stands (joins allow only counts and sums, which subtract). The
telescoped delta rule (`delta_rule`) would look them up in the other upstreams instead:
for orders deleted all over the key range, a scan of every line item.

The other tables' lost rows, and every gained row, are walked along the tree. So that a
join row holding changed rows of several tables is counted once, it is given to the
first of those tables (the MV's or state's scan first, then FROM order): the walk from table i
reads each earlier table without its changed keys (a broadcast anti-join), and rows of i
whose join with a neighbour by that neighbour's whole key can only meet such an excluded
row are dropped before the walk (a new order's line items, for a term of new line items).
"""

from __future__ import annotations

import functools
import logging
import operator
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from airflow_backfill.engine.aggregates.state import read_state, state_rows_found, state_uri
from airflow_backfill.engine.delta.driver_rows import (
    HeldRows,
    arrow_of,
    distinct_rows,
    held_rows,
    held_table,
    local_arrow,
    local_join,
    local_relation,
    select_columns,
)
from airflow_backfill.engine.delta.key_range import boundable, table_rows
from airflow_backfill.engine.delta.keyed_rows import FILE, POSITION, find_rows
from airflow_backfill.engine.delta.listed_files import read_table
from airflow_backfill.engine.delta.log import load_table, spark_schema
from airflow_backfill.engine.delta.log_state import table_state
from airflow_backfill.engine.joins.delta_rule import JoinChanges, netted_changes, no_rows
from airflow_backfill.engine.joins.relation import Reader, edge, first_hop_columns, walk
from airflow_backfill.engine.planning.aggregate_sql import key_columns, quote, state_value_columns
from airflow_backfill.engine.planning.join_query import JoinPlan, flat_column, grouped_key, selected_key
from airflow_backfill.engine.rounds.changes import SIGN
from airflow_backfill.engine.sizes import sizes

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession

    from airflow_backfill.job import BackfillJob

log = logging.getLogger(__name__)


def applies(plan: JoinPlan) -> bool:
    """A join without LEFT joins (every table in every row)."""
    return len(plan.core()) == len(plan.tables)


def pays_off(job: BackfillJob) -> bool:
    """The upstreams hold more than `sizes.small_join_rows` rows together (their files'
    statistics, read from the logs)."""
    return sum(table_rows(upstream.table) for upstream in job.upstreams) > sizes().small_join_rows


def join_changes(spark: SparkSession, job: BackfillJob, plan: JoinPlan, old: Mapping[str, int],
                 new: Mapping[str, int]) -> JoinChanges:
    """The round's signed flat join rows plus the MV rows (`JoinChanges.leaving`) or the
    aggregate's groups (`leaving_groups`) that leave."""
    cached: list[DataFrame] = []
    try:
        lost: dict[int, DataFrame] = {}
        gained: dict[int, DataFrame] = {}
        bounds: dict[tuple[int, bool], dict[str, tuple[Any, Any]]] = {}
        change_rows = 0
        for index, table in enumerate(plan.tables):
            if new[table.name] == old[table.name]:
                continue
            changes = netted_changes(spark, job, plan, index, old[table.name], new[table.name])
            cached.append(changes)
            for arriving, (count, ranges) in _sides(plan, index, changes).items():
                change_rows += count
                bounds[index, arriving] = ranges
                (gained if arriving else lost)[index] = _side(changes, arriving)
        leaving = leaving_groups = None
        from_mv = _keys_held(plan, lost)
        if from_mv and plan.flat.aggregate is None:
            leaving = _leaving_mv_rows(spark, job, plan, {i: lost[i] for i in from_mv}, from_mv)
        elif from_mv:
            leaving_groups = _leaving_groups(spark, job, plan, {i: lost[i] for i in from_mv}, from_mv)
        walked_lost = [i for i in lost if i not in from_mv]
        terms = _terms(spark, job, plan, old, lost, walked_lost, excluded_first=list(from_mv), cached=cached,
                       bounds={i: bounds[i, False] for i in lost})
        terms += _terms(spark, job, plan, new, gained, list(gained), excluded_first=[], cached=cached,
                        bounds={i: bounds[i, True] for i in gained})
    except BaseException:
        for frame in cached:
            frame.unpersist()
        raise
    # Read once, by the aggregate's fold or the stateless round's held keyed changes: not cached.
    rows = _union(terms) if terms else no_rows(spark, job, plan, new)
    return JoinChanges(rows, change_rows, cached, leaving, leaving_groups)


def _union(terms: list[DataFrame]) -> DataFrame:
    """The terms' rows together: one local relation when the driver holds every term (a
    union of local relations is no local relation to Spark, so the fold after it would
    run jobs), else Spark's union."""
    import pyarrow as pa
    from pyspark.sql.types import StructField, StructType

    from airflow_backfill.engine.delta.arrow_types import arrow_schema_of

    if len(terms) == 1:
        return terms[0]
    held = [local_arrow(term) for term in terms]
    if all(rows is not None for rows in held):
        schema = StructType([StructField(field.name, field.dataType, any(t.schema[field.name].nullable for t in terms))
                             for field in terms[0].schema.fields])
        try:
            target = arrow_schema_of(schema)
            rows = pa.concat_tables([part.select(schema.names).cast(target) for part in held if part is not None])
        except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
            log.info("join terms united by Spark: %s", error)
        else:
            local = local_relation(terms[0].sparkSession, rows, schema)
            if local is not None:
                return local
    return functools.reduce(lambda a, b: a.unionByName(b), terms)


def _keys_held(plan: JoinPlan, tables: Mapping[int, DataFrame]) -> dict[int, tuple[str, ...]]:
    """Of `tables`, those whose key the MV selects (a stateless MV) or its grouping holds
    (an aggregate's state): their columns there."""
    aggregate = plan.flat.aggregate
    held: dict[int, tuple[str, ...]] = {}
    for index in tables:
        if aggregate is None:
            key = selected_key(plan, index)
        else:
            positions = grouped_key(plan, index)
            key = None if positions is None else tuple(key_columns(aggregate)[p] for p in positions)
        if key is not None:
            held[index] = key
    return held


def _sides(plan: JoinPlan, index: int, changes: DataFrame) -> dict[bool, tuple[int, dict[str, tuple[Any, Any]]]]:
    """Per side of table `index`'s netted changes (True: gained rows, False: lost), its rows
    and the range of each column its walk bounds the next tables by (`first_hop_columns`,
    those of a `boundable` type: the walk bounds by no other), in one job (none for changes the driver holds): the walk's first hop then reads no
    bounds of its own. Sides without rows are left out."""
    from pyspark.sql import functions as F

    columns = [c for c in first_hop_columns(plan, index) if boundable(changes.schema[c].dataType)]
    rows = arrow_of(changes)
    if rows is not None:  # counted by the driver from its Arrow rows
        return _sides_of_arrow(rows, columns)
    ranges = [agg for c in columns for agg in (F.min(F.col(quote(c))), F.max(F.col(quote(c))))]
    found = changes.groupBy((F.col(SIGN) > 0).alias("__gained")).agg(F.count(F.lit(1)), *ranges).collect()
    return {row[0]: (row[1], {c: (row[2 + 2 * n], row[3 + 2 * n]) for n, c in enumerate(columns)})
            for row in found if row[1]}


def _sides_of_arrow(rows: pa.Table, columns: list[str]) -> dict[bool, tuple[int, dict[str, tuple[Any, Any]]]]:
    """`_sides` of changes the driver holds as Arrow (NULLs are left out of the ranges, as
    Spark's min and max leave them out)."""
    import pyarrow.compute as pc

    sides = {}
    signs = rows.column(SIGN)
    for gained in (True, False):
        side = rows.filter(pc.greater(signs, 0) if gained else pc.less(signs, 0))
        if side.num_rows:
            ranges = {c: tuple(pc.min_max(side.column(c)).values()) for c in columns}
            sides[gained] = (side.num_rows, {c: (low.as_py(), high.as_py()) for c, (low, high) in ranges.items()})
    return sides


def _side(changes: DataFrame, gained: bool) -> DataFrame:
    """The gained (`__sign` > 0) or lost rows of netted changes: by Arrow when the driver
    holds them (a local relation it holds again), else Spark's filter."""
    import pyarrow.compute as pc
    from pyspark.sql import functions as F

    rows = arrow_of(changes)
    if rows is not None:
        signs = rows.column(SIGN)
        local = local_relation(changes.sparkSession, rows.filter(pc.greater(signs, 0) if gained else pc.less(signs, 0)),
                               changes.schema)
        if local is not None:
            return local
    return changes.filter(F.col(SIGN) > 0 if gained else F.col(SIGN) < 0)


def _terms(spark: SparkSession, job: BackfillJob, plan: JoinPlan, versions: Mapping[str, int],
           changed: Mapping[int, DataFrame], order: list[int], *, excluded_first: list[int],
           cached: list[DataFrame], bounds: Mapping[int, Mapping[str, tuple[Any, Any]]]) -> list[DataFrame]:
    """For each table of `order` in turn: its `changed` rows that hold no changed row of a
    table before it (in `excluded_first`, then `order`), walked over the other tables as
    of `versions` without those tables' changed keys (`bounds`: per table, the ranges
    `_sides` read over all of its changed rows, which hold the walked ones)."""
    terms = []
    earlier = [j for j in excluded_first if j in changed]
    for index in order:
        excluded = {j: _keys(plan, j, changed[j]) for j in earlier}
        rows, filtered = _without_excluded_neighbours(plan, index, changed[index], excluded)
        earlier.append(index)
        if filtered and not rows.take(1):
            continue
        read = _ReaderWithout(spark, job, plan, versions, excluded)
        terms.append(walk(plan, index, rows, read, cached=cached, start_bounds=bounds[index]))
    return terms


def _keys(plan: JoinPlan, index: int, rows: DataFrame) -> DataFrame:
    """The distinct keys of `rows` of table `index`, named as the upstream names them."""
    table = plan.tables[index]
    key = list(table.primary_key)
    return distinct_rows(rows, [flat_column(table.name, c) for c in key], key)


def _held_keys(plan: JoinPlan, index: int, rows: DataFrame) -> HeldRows | None:
    """`_keys` of rows the driver holds, as Arrow (None when it does not hold them)."""
    table = plan.tables[index]
    key = list(table.primary_key)
    held = held_rows(rows)
    return None if held is None else held.select([flat_column(table.name, c) for c in key], key).distinct(key)


def _without_excluded_neighbours(plan: JoinPlan, index: int, rows: DataFrame,
                                 excluded: Mapping[int, DataFrame]) -> tuple[DataFrame, bool]:
    """`rows` of table `index` less those that join a neighbour by its whole key at an
    excluded key of it (the one row they could join there is left out of the read), and
    whether any neighbour dropped some that way."""
    from pyspark.sql import functions as F

    filtered = False
    for there, keys in excluded.items():
        if there not in plan.neighbours(index):
            continue
        _, pairs = edge(plan, index, there)
        by_key = {theirs.lower(): mine for mine, theirs in pairs}
        key = plan.tables[there].primary_key
        if not all(column.lower() in by_key for column in key):
            continue
        excluded_columns = [f"__excluded{n}" for n in range(len(key))]
        renamed = select_columns(keys, list(key), excluded_columns)
        mine = [flat_column(plan.tables[index].name, by_key[c.lower()]) for c in key]
        kept = local_join(rows, renamed, mine, excluded_columns, "left_anti")
        if kept is None:
            condition = _all(F.col(quote(m)) == F.col(e) for m, e in zip(mine, excluded_columns, strict=True))
            kept = rows.join(F.broadcast(renamed), condition, "left_anti")
        rows, filtered = kept, True
    return rows, filtered


class _ReaderWithout(Reader):
    """Reads each upstream as of its version, without the rows of its excluded keys."""

    def __init__(self, spark: SparkSession, job: BackfillJob, plan: JoinPlan, versions: Mapping[str, int],
                 excluded: Mapping[int, DataFrame]) -> None:
        super().__init__(spark, job, plan, versions)
        self._excluded, self._tables = dict(excluded), plan.tables

    def _kept(self, index: int, rows: DataFrame) -> DataFrame:
        from pyspark.sql import functions as F

        keys = self._excluded.get(index)
        if keys is None:
            return rows
        key = list(self._tables[index].primary_key)
        return rows.join(F.broadcast(keys), key, "left_anti")

    def _kept_held(self, index: int, rows: HeldRows) -> HeldRows | None:
        keys = self._excluded.get(index)
        if keys is None:
            return rows
        excluded = held_rows(keys)
        key = list(self._tables[index].primary_key)
        return None if excluded is None else rows.join(excluded, key, key, "left_anti")


def _leaving_mv_rows(spark: SparkSession, job: BackfillJob, plan: JoinPlan, lost: Mapping[int, DataFrame],
                     mv_keys: Mapping[int, tuple[str, ...]]) -> DataFrame:
    """The MV's rows that hold a lost row of a table in `lost` (whose key the MV selects
    as `mv_keys`), with `__sign` -1: one scan of the MV, each lost table's keys broadcast.
    The MV is read from the file list of its checksum where it has one (`read_table`): the
    version the last round committed then needs no state rebuilt for the scan."""
    from pyspark.sql import functions as F

    found = _holding_found(spark, job.target, plan, lost, mv_keys)
    if found is not None:  # looked up by the driver: a cost that follows the lost keys
        return found.select(*(quote(c) for c in found.columns), F.lit(-1).alias(SIGN))
    held = held_table(spark, job.target)  # a small MV: its leaving rows are picked by the driver
    mv = read_table(spark, job.target) if held is None else held
    return _holding(plan, mv, lost, mv_keys).select(*(quote(c) for c in mv.columns), F.lit(-1).alias(SIGN))


def _leaving_groups(spark: SparkSession, job: BackfillJob, plan: JoinPlan, lost: Mapping[int, DataFrame],
                    state_keys: Mapping[int, tuple[str, ...]]) -> DataFrame:
    """The state rows of the groups that hold a lost row of a table in `lost` (whose key
    the grouping holds, in the state's `state_keys` columns): every row of such a group
    holds that lost row, so the whole group leaves. A small state is read by the driver."""
    assert plan.flat.aggregate is not None
    aggregate = plan.flat.aggregate
    columns = [*key_columns(aggregate), *state_value_columns(aggregate)]
    state = read_state(spark, job, columns, held=not state_rows_found(job))
    found = _holding_found(spark, state_uri(job.target), plan, lost, state_keys)
    return found.select(*(quote(c) for c in columns)) if found is not None else _holding(plan, state, lost, state_keys)


def _holding_found(spark: SparkSession, uri: str, plan: JoinPlan, lost: Mapping[int, DataFrame],
                   key_columns_of: Mapping[int, tuple[str, ...]]) -> DataFrame | None:
    """`_holding` of the table at `uri` (an MV or a state) looked up by the driver: for each
    lost table, the rows whose `key_columns_of` equal a lost key, found in the files their
    statistics meet (`keyed_rows`, deletion vectors applied), as one local relation; None
    when the driver does not hold every lost key or does not find the rows."""
    import pyarrow as pa

    from airflow_backfill.engine.delta.arrow_types import arrow_schema_of

    state = table_state(uri)
    if state is None:
        return None
    schema = spark_schema(load_table(uri))
    found_parts = []
    for index, rows in lost.items():
        keys = _held_keys(plan, index, rows)
        if keys is None:
            return None
        columns = list(key_columns_of[index])
        found = find_rows(state, columns, keys.table.rename_columns(columns), list(schema.names))
        if found is None:
            return None
        found_parts.append(found.rows)
    try:
        target = arrow_schema_of(schema)
        every = pa.concat_tables(found_parts, promote_options="permissive") if found_parts else target.empty_table()
        if len(found_parts) > 1:  # a row holding lost keys of two tables is taken once
            numbered = every.append_column(_ROW_NUMBER, pa.array(np.arange(every.num_rows, dtype=np.int64)))
            first = numbered.group_by([FILE, POSITION], use_threads=False).aggregate([(_ROW_NUMBER, "min")])
            every = every.take(np.sort(first.column(f"{_ROW_NUMBER}_min").to_numpy()))
        rows = every.select(list(schema.names)).cast(target)
    except (KeyError, TypeError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
        log.info("rows of %s holding lost keys left to Spark: %s", uri, error)
        return None
    return local_relation(spark, rows, schema)


def _holding(plan: JoinPlan, table: DataFrame, lost: Mapping[int, DataFrame],
             key_columns_of: Mapping[int, tuple[str, ...]]) -> DataFrame:
    """`table`'s rows whose `key_columns_of[i]` equal the key of a row of `lost[i]`, for
    some i: picked by the driver when it holds them all (a local relation again, so the
    fold reads it without a job), else one scan with each table's keys broadcast."""
    from pyspark.sql import functions as F

    picked = _holding_held(plan, table, lost, key_columns_of)
    if picked is not None:
        return picked
    columns, marked = list(table.columns), table
    marks = []
    for index, rows in lost.items():
        key = plan.tables[index].primary_key
        renamed = [f"__lost{index}_{n}" for n in range(len(key))]
        mark = f"__lost{index}"
        keys = (_keys(plan, index, rows).select(*(F.col(quote(c)).alias(r) for c, r in zip(key, renamed, strict=True)))
                .withColumn(mark, F.lit(True)))
        condition = _all(F.col(quote(m)) == F.col(r) for m, r in zip(key_columns_of[index], renamed, strict=True))
        marked = marked.join(F.broadcast(keys), condition, "left").drop(*renamed)
        marks.append(mark)
    held = functools.reduce(operator.or_, [F.col(m).isNotNull() for m in marks])
    return marked.filter(held).select(*(quote(c) for c in columns))


def _holding_held(plan: JoinPlan, table: DataFrame, lost: Mapping[int, DataFrame],
                  key_columns_of: Mapping[int, tuple[str, ...]]) -> DataFrame | None:
    """`_holding` by Arrow's semi-joins, when the driver holds `table` and every lost
    key; None otherwise."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyspark.sql.types import LongType, StructField, StructType

    rows = held_rows(table)
    if rows is None:
        return None
    numbered = HeldRows(rows.table.append_column(_ROW_NUMBER, pa.array(range(rows.table.num_rows), pa.int64())),
                        StructType([*rows.schema.fields, StructField(_ROW_NUMBER, LongType(), False)]))
    found = []
    for index, lost_rows in lost.items():
        key = list(plan.tables[index].primary_key)
        keys = _held_keys(plan, index, lost_rows)
        hit = None if keys is None else numbered.join(keys, list(key_columns_of[index]), key, "left_semi")
        if hit is None:
            return None
        found.extend(hit.table.column(_ROW_NUMBER).chunks)
    picked = pc.unique(pa.chunked_array(found, pa.int64())).sort()
    return HeldRows(rows.table.take(picked), rows.schema).local_frame(table.sparkSession)


_ROW_NUMBER = "__airflow_backfill_row"


def _all(conditions: object) -> Column:
    """The AND of the conditions."""
    return functools.reduce(operator.and_, list(conditions))  # type: ignore[call-overload]
