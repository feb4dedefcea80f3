"""Write keyed changes into a Delta table in one commit with the watermark, the cheapest way.

Keyed changes hold at most one row per key: the key's new row (`__present` true) or its
departure (`__present` null). Five ways apply them (`planning/round_plan.py` estimates
each): an append (every key new, above the table's largest); a replace when some change
has a new row (the table's rows of every changed key deleted by a semi-join with the
keys, deletion vectors, and the new rows appended, in one commit: Delta's `replaceOn`,
or the table's listed files when some keys leave without a new row); a delete when every
change deletes its key (Delta's DELETE by the same semi-join); a MERGE (any changes);
an overwrite of the whole table (small tables; when the driver writes it, with a change
file of the changed keys' rows, so that its feed is the change, not the table).
`prepare` holds the changes in memory and reads what the estimates need: the keys' range
and counts (one small job over the changes, none when the driver holds them) and the
table's rows within the range (its files' statistics, no data read). `write` applies them.

A change with `__arrived` (the upstream's rows with the key grew by one over the range)
must not meet a row the table holds: the upstream would then hold the key twice. MERGE
refuses such a key in its first clause; the other ways look the arrived keys up first
(`refuse_arrived_keys_held`), which reads nothing when they all lie above the table's
largest key, as new keys usually do.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from airflow_backfill.engine.delta.commits import (
    ARRIVED,
    CHANGES,
    PRESENT,
    REPEATED_KEY,
    TARGET,
    append_new,
    conform,
    delete_keys,
    merge_changes,
    overwrite,
    overwrite_rows,
    repeated_key_error,
    replace_and_delete_listed,
    replace_keys,
    replace_matching,
)
from airflow_backfill.engine.delta.driver_file import writable
from airflow_backfill.engine.delta.driver_rows import (
    TableRows,
    arrow_rows,
    held_whole,
    local_arrow,
    local_relation,
)
from airflow_backfill.engine.delta.key_literals import keys_condition, literal_types
from airflow_backfill.engine.delta.key_lookup import comparable_key, contains, same_rows
from airflow_backfill.engine.delta.key_range import (
    EMPTY,
    KeyRange,
    all_above,
    bound_literal,
    boundable,
    key_range,
    key_range_of_table,
    rows_in_range,
    table_key_max,
    within_bounds,
)
from airflow_backfill.engine.delta.keyed_rows import FILE, POSITION, FoundRows, find_rows, rows_at
from airflow_backfill.engine.delta.listed_files import listed_rows, read_table
from airflow_backfill.engine.delta.log import DELETION_VECTORS_PROPERTY, load_table, spark_schema
from airflow_backfill.engine.delta.log_state import table_state
from airflow_backfill.engine.delta.overwrite_feed import overwrite_change_rows
from airflow_backfill.engine.delta.patch_actions import fits, marked_files
from airflow_backfill.engine.delta.transaction_write import patch_with_watermark
from airflow_backfill.engine.planning.aggregate_sql import quote
from airflow_backfill.engine.planning.round_plan import (
    APPEND,
    AUTO,
    DELETE,
    MERGE,
    OVERWRITE,
    PATCH,
    REPLACE,
    Rates,
    TableFacts,
    allowed_mv_ways,
    write_estimates,
)
from airflow_backfill.engine.sizes import sizes
from airflow_backfill.exceptions import BackfillError
from airflow_backfill.storage.lease import ensure_held

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructField, StructType

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PreparedChanges:
    """Keyed changes of one table, conformed to its types and held in memory, with the
    facts their write's estimates need."""

    uri: str
    frame: DataFrame
    key: tuple[str, ...]
    null_safe: bool
    leading: StructField
    changed: KeyRange
    table_max: Any
    """The table's largest leading key (`EMPTY`, or None when unknown or not boundable)."""
    facts: TableFacts
    table_version: int
    """The table's version the facts and an overwrite's kept rows are read at."""
    schema: StructType
    """The table's columns at that version (from its log)."""
    table_rows: TableRows | None = None
    """The table's rows, when the caller read them already (used at `table_version` only)."""
    located: FoundRows | None = None
    """The table's live rows of the changed keys (their key columns) with their files and
    positions, when the driver found them (`keyed_rows`): what a patch deletes."""
    old_rows: pa.Table | None = None
    """The table's rows of (at least) the changed keys before the changes, in its columns,
    when the caller knows them (a stateless MV's query over the rows before the range):
    a patch's change file then takes its old images from them, not from the table's files."""

    @property
    def arrived(self) -> bool:
        """Whether some change's key arrived (`__arrived`, counted by `prepare`)."""
        return ARRIVED in self.frame.columns and self.changed.flagged_rows > 0

    def estimates(self, rates: Rates) -> dict[str, float]:
        """Seconds each way that can apply these changes would take."""
        return write_estimates(self.facts, self.changed.rows or 0, self.changed.present_rows, rates)

    def release(self) -> None:
        self.frame.unpersist()


def prepare(spark: SparkSession, uri: str, changes: DataFrame, key: Sequence[str], *, null_safe: bool,
            table_rows: TableRows | None = None, located: FoundRows | None = None,
            old_rows: pa.Table | None = None) -> PreparedChanges:
    """Hold `changes` in memory, conformed to the table at `uri`, and read its facts.
    `table_rows`: the table's rows the caller read (`table_rows_in_driver`), which an
    overwrite the driver writes then does not read again. `located`: the table's rows of
    keys that include the changes' (`locate_keys` at the table's latest version), which a
    patch then does not look up again."""
    table = load_table(uri)
    version = table.version()
    target = spark_schema(table)  # from the log: no table loaded by Spark
    frame = conform(changes, target)
    leading = next(f for f in target.fields if f.name.lower() == key[0].lower())
    flag = ARRIVED if ARRIVED in frame.columns else None
    held = local_arrow(frame)  # changes the driver holds: their range costs no job
    if held is not None:
        changed = key_range_of_table(held, leading.name, PRESENT, flag)
    else:
        frame = frame.persist()
        changed = key_range(frame, leading.name, PRESENT, flag)
    usable = boundable(leading.dataType)
    table_max = table_key_max(uri, leading.name) if usable else None
    total, touched = rows_in_range(uri, leading.name, changed if usable else None)
    new_keys_only = all_above(changed, table_max)
    if held is None or new_keys_only:
        located = None
    elif located is None or located.version != version:
        located = locate_keys(uri, version, target, held, key, null_safe)
    facts = TableFacts(rows=total, touched_rows=touched, new_keys_only=new_keys_only,
                       patched_files=None if located is None else len(located.files))
    return PreparedChanges(uri, frame, tuple(key), null_safe, leading, changed, table_max, facts, version, target,
                           table_rows, located, old_rows)


def locate_keys(uri: str, version: int, schema: StructType, changes: pa.Table, key: Sequence[str],
                null_safe: bool) -> FoundRows | None:
    """The table's live rows of the changes' keys, found by the driver (`keyed_rows`), when a
    patch can write them: the table keeps deletion vectors, its columns are of types the
    driver writes, and its keys compare in Arrow as in Spark. None otherwise."""
    from airflow_backfill.engine.delta.arrow_types import arrow_schema_of

    state = table_state(uri, version)
    if state is None or state.configuration.get(DELETION_VECTORS_PROPERTY) != "true":
        return None
    if "deletionVectors" not in state.reader_features:
        return None
    try:
        target = arrow_schema_of(schema)
    except (TypeError, NotImplementedError):
        return None
    if not writable(target.empty_table()):
        return None
    names = {name.lower(): name for name in schema.names}
    columns = [names[column.lower()] for column in key]
    try:
        keys = pa.table([changes.column(column).cast(target.field(column).type) for column in columns],
                        names=columns)
    except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    found = find_rows(state, columns, keys, null_safe=null_safe)
    if found is not None and not all(fits(live) for live in found.files):
        return None
    return found


def write(
    spark: SparkSession, prepared: PreparedChanges, way: str, *, app_id: str, version: int, user_metadata: str,
    before_commit: Callable[[], None] | None = None, fed: bool = True,
) -> int:
    """Apply the prepared changes the `way` given, moving the watermark, in one commit.
    Returns the changed keys written (0 when the table already has transaction `version`).
    `before_commit` runs before the commit: once the files are written for an overwrite,
    before anything is written for the other ways. `fed`: an overwrite the driver writes
    keeps the table's feed to the change (False for a table whose feed nobody reads, such
    as an aggregate's state: no change file to write)."""
    from pyspark.sql import functions as F

    ensure_held(prepared.uri)
    if (load_table(prepared.uri).transaction_version(app_id) or -1) >= version:
        return 0  # applied already: Delta would skip the write
    rows = prepared.changed.rows or 0

    def new_rows() -> DataFrame:  # built only for the ways Spark writes
        return prepared.frame.filter(f"`{PRESENT}` IS NOT NULL").drop(PRESENT, ARRIVED)

    if not rows:  # nothing changed here: whatever the way, only the watermark moves
        way = APPEND
    _refuse_unfit_way(way, prepared)
    if before_commit is not None and way != OVERWRITE:
        before_commit()
    if way == MERGE:
        _merge(spark, prepared, app_id=app_id, version=version, user_metadata=user_metadata)
        return rows
    if prepared.arrived:
        refuse_arrived_keys_held(spark, prepared)
    if way == PATCH:
        if _patch(spark, prepared, app_id=app_id, version=version, user_metadata=user_metadata, fed=fed):
            log.info("%s %s changed keys into %s (%s rows)", way, rows, prepared.uri, prepared.changed.present_rows)
            return rows
        log.info("patch of %s not written by the driver: replacing through Delta", prepared.uri)
        way = REPLACE if prepared.changed.present_rows else DELETE
    if way == APPEND:
        append_new(new_rows(), prepared.uri, app_id=app_id, version=version, user_metadata=user_metadata)
    elif way in (REPLACE, DELETE) and (literal := _keys_as_literals(prepared)) is not None:
        # A delete is a replace by no rows (`new_rows` is empty then).
        replace_matching(new_rows(), prepared.uri, literal, app_id=app_id, version=version, user_metadata=user_metadata)
    elif way == REPLACE and prepared.changed.present_rows != rows:  # some keys leave, others get new rows
        keys = prepared.frame.select(*(F.col(quote(k)) for k in prepared.key))
        if not replace_and_delete_listed(new_rows(), keys, prepared.uri, prepared.key, _bound_sql(prepared, TARGET + "."),
                                         app_id=app_id, version=version, user_metadata=user_metadata,
                                         null_safe=prepared.null_safe, leading_nulls=prepared.changed.has_nulls):
            _merge(spark, prepared, app_id=app_id, version=version, user_metadata=user_metadata)
    elif way == REPLACE:
        replace_keys(new_rows(), prepared.uri, prepared.key, _bound_sql(prepared, TARGET + "."), app_id=app_id,
                     version=version, user_metadata=user_metadata, null_safe=prepared.null_safe,
                     leading_nulls=prepared.changed.has_nulls)
    elif way == DELETE:
        keys = prepared.frame.select(*(F.col(quote(k)) for k in prepared.key))
        delete_keys(keys, prepared.uri, prepared.key, _bound_sql(prepared, TARGET + "."), app_id=app_id, version=version,
                    user_metadata=user_metadata, null_safe=prepared.null_safe, leading_nulls=prepared.changed.has_nulls)
    elif way == OVERWRITE:
        split = _split_in_driver(spark, prepared)
        held = None if split is None else _overwrite_in_driver(split, prepared, fed=fed)
        written = None if held is None else overwrite_rows(
            spark, held.after, prepared.uri, app_id=app_id, version=version, user_metadata=user_metadata,
            before_commit=before_commit, changes=held.changes)
        if written is None:  # not the driver's to write: Spark writes them
            overwrite(_rows_after(spark, prepared, None if split is None else split.kept, new_rows()), prepared.uri,
                      app_id=app_id, version=version, user_metadata=user_metadata, before_commit=before_commit)
    else:
        raise ValueError(f"unknown way to write keyed changes: {way!r}")
    log.info("%s %s changed keys into %s (%s rows)", way, rows, prepared.uri, prepared.changed.present_rows)
    return rows


def _patch(spark: SparkSession, prepared: PreparedChanges, *, app_id: str, version: int, user_metadata: str,
           fed: bool) -> bool:
    """Write the changes as a patch (`patch_actions`): the old rows of their keys marked
    deleted, their new rows appended, their change rows as the commit's change file. A key
    whose new row equals its old one is left as it is. False when the driver cannot write
    it (the table moved, a type does not convert): nothing is committed then."""
    from airflow_backfill.engine.delta.arrow_types import arrow_schema_of

    located, changes = prepared.located, local_arrow(prepared.frame)
    if located is None or changes is None:
        return False
    names = {name.lower(): name for name in prepared.schema.names}
    key = [names[column.lower()] for column in prepared.key]
    try:
        target = arrow_schema_of(prepared.schema)
        old = located.rows.filter(contains(located.rows, key, changes, key))
        new = changes.filter(pc.is_valid(changes.column(PRESENT))).select(target.names).cast(target)
        old_rows = _old_images(prepared, old, key) if fed else None
        if fed and old_rows is None:
            return False
        if old_rows is not None:
            old_rows = old_rows.select(target.names).cast(target)
        same = None if old_rows is None else same_rows(old_rows, new, key)
    except (KeyError, TypeError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
        log.info("patch of %s left to Delta: %s", prepared.uri, error)
        return False
    if same is not None and old_rows is not None:  # keys whose row did not change: nothing to write for them
        unchanged = old_rows.filter(same).select(key)
        old = old.filter(pc.invert(contains(old, key, unchanged, key)))
        old_rows = old_rows.filter(pc.invert(contains(old_rows, key, unchanged, key)))
        new = new.filter(pc.invert(contains(new, key, unchanged, key)))
    marked = marked_files(located.files, old.column(FILE).to_numpy(), old.column(POSITION).to_numpy())
    feed = overwrite_change_rows(old_rows, new, key) if old_rows is not None else None
    written = patch_with_watermark(
        spark, prepared.uri, read_version=prepared.table_version, marked=marked,
        rows=new.sort_by([(column, "ascending") for column in key]), changes=feed, app_id=app_id, version=version,
        user_metadata=user_metadata, predicate=f"{old.num_rows} rows replaced by {new.num_rows}")
    return written is not None


def _old_images(prepared: PreparedChanges, old: pa.Table, key: list[str]) -> pa.Table | None:
    """The old rows of the located keys `old`: the caller's (`old_rows`), else read from
    the table's files where they are (`rows_at`). A table whose feed nobody reads (an
    aggregate's state) needs none: the patch then writes no change file."""
    names = list(prepared.schema.names)
    if prepared.old_rows is not None:
        given = {name.lower(): name for name in prepared.old_rows.column_names}
        if all(name.lower() in given for name in names):
            rows = prepared.old_rows.select([given[name.lower()] for name in names]).rename_columns(names)
            mine = rows.filter(contains(rows, key, old, key))
            if mine.num_rows == old.num_rows:
                return mine
    if prepared.located is None:
        return None
    return rows_at(_with_rows(prepared.located, old), names)


def _with_rows(found: FoundRows, rows: pa.Table) -> FoundRows:
    return FoundRows(rows, found.files, found.scanned, found.version)


def _merge(spark: SparkSession, prepared: PreparedChanges, *, app_id: str, version: int, user_metadata: str) -> None:
    merge_changes(spark, prepared.uri, prepared.frame, prepared.key, _merge_bound(prepared),
                  app_id=app_id, version=version, user_metadata=user_metadata, null_safe=prepared.null_safe,
                  deletes_only=prepared.changed.present_rows == 0 and not prepared.arrived)


def _keys_as_literals(prepared: PreparedChanges) -> str | None:
    """The changed keys as a condition of literals, when the driver holds a few of them
    (`key_literals`): no job to read them, and no semi-join to find their rows."""
    if (prepared.changed.rows or 0) > sizes().literal_keys:
        return None
    fields = {field.name.lower(): field for field in prepared.frame.schema.fields}
    key_fields = [fields[k.lower()] for k in prepared.key]
    held = local_arrow(prepared.frame) if literal_types(key_fields) else None  # no job
    if held is None:
        return None
    keys = list(zip(*(held.column(field.name).to_pylist() for field in key_fields), strict=True))
    return keys_condition(keys, key_fields, null_safe=prepared.null_safe)


def _bound_sql(prepared: PreparedChanges, qualifier: str = "") -> str | None:
    """A condition on the table alone that holds for every row a change can meet: the changes'
    leading key range as literals, which Delta skips files with (None when not boundable)."""
    changed = prepared.changed
    if not boundable(prepared.leading.dataType) or changed.has_nulls or changed.low is None:
        return None
    column, kind = qualifier + quote(prepared.leading.name), prepared.leading.dataType.simpleString().upper()
    return f"{column} BETWEEN CAST('{changed.low}' AS {kind}) AND CAST('{changed.high}' AS {kind})"


def _rows_after(spark: SparkSession, prepared: PreparedChanges, kept_rows: pa.Table | None,
                new_rows: DataFrame) -> DataFrame:
    """The whole table after the changes: its rows of unchanged keys (read at the version
    the changes were prepared against; `kept_rows`: those rows when the driver holds them)
    and the new rows; in one partition, so one file, when they are few (`sizes.one_file_rows`)."""
    current = read_table(spark, prepared.uri, prepared.table_version)
    kept = None if kept_rows is None else local_relation(spark, kept_rows, current.schema)
    if kept is None:
        kept = current.alias(TARGET).join(prepared.frame.select(*prepared.key).alias(CHANGES),
                                          on=_same_key(prepared, TARGET, CHANGES), how="left_anti")
    after = kept.unionByName(new_rows)
    return after.coalesce(1) if prepared.facts.rows + prepared.changed.present_rows <= sizes().one_file_rows else after


@dataclass(frozen=True)
class SplitRows:
    """A small table's rows the driver holds, split by the changes' keys."""

    kept: pa.Table
    """The rows of unchanged keys."""
    leaving: pa.Table
    """The rows of changed keys: what the changes replace or delete."""
    key: list[str]
    """The key columns, as the table spells them."""
    changes: pa.Table
    """The keyed changes themselves (`PreparedChanges.frame`'s rows)."""


@dataclass(frozen=True)
class DriverOverwrite:
    """An overwrite the driver writes: the table after the changes, and its change rows."""

    after: pa.Table
    changes: pa.Table | None
    """None when the table's feed is not kept to the change (`write`'s `fed`)."""


def _overwrite_in_driver(split: SplitRows, prepared: PreparedChanges, *, fed: bool) -> DriverOverwrite | None:
    """The whole table after the changes as Arrow, in the table's columns and types, with
    the change rows of the overwrite (`overwrite_feed`): the driver then writes the table's
    one file and its change file. None when a type does not convert."""
    from airflow_backfill.engine.delta.arrow_types import arrow_schema_of

    arriving = split.changes.filter(pc.is_valid(split.changes.column(PRESENT)))  # the keys' new rows
    try:
        target = arrow_schema_of(prepared.schema)
        kept, leaving, arriving = (part.select(target.names).cast(target)
                                   for part in (split.kept, split.leaving, arriving))
        changes = overwrite_change_rows(leaving, arriving, split.key) if fed else None
    except (KeyError, TypeError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
        log.info("new rows of %s written by Spark: %s", prepared.uri, error)
        return None
    return DriverOverwrite(pa.concat_tables([kept, arriving]), changes)


def _split_in_driver(spark: SparkSession, prepared: PreparedChanges) -> SplitRows | None:
    """The table's rows split by the changes' keys, as Arrow, when the changes are held by
    the driver and the table is small (an aggregate's state or MV): the write then needs no
    broadcast anti-join over a scan, a few tenths of a second a table. None otherwise,
    or for key types Arrow compares otherwise than Spark (`comparable_key`: floating
    point, nested)."""
    read = prepared.table_rows
    held = read if read is not None and read.version == prepared.table_version else None
    if held is None and not held_whole(prepared.uri):
        return None
    changes = local_arrow(prepared.frame)  # no job
    if changes is None:
        return None
    names = {field.name.lower(): field.name for field in prepared.schema.fields}
    key_names = [names[column.lower()] for column in prepared.key]
    if not all(comparable_key(changes.schema.field(name).type) for name in key_names):
        return None
    table = held.rows if held is not None else listed_rows(spark, prepared.uri, prepared.table_version,
                                                           prepared.schema)
    if table is None:
        table = arrow_rows(read_table(spark, prepared.uri, prepared.table_version), sizes().held_table_rows)
    if table is None:
        return None
    try:
        changed = contains(table, key_names, changes, key_names)  # `<=>`
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
        log.info("kept rows of %s left to Spark: %s", prepared.uri, error)
        return None
    if not prepared.null_safe:  # `=`: a table row with a NULL key part matches no change
        for name in key_names:
            changed = pc.and_(changed, pc.is_valid(table.column(name)))
    return SplitRows(table.filter(pc.invert(changed)), table.filter(changed), key_names, changes)


def _same_key(prepared: PreparedChanges, left: str, right: str) -> Any:
    from pyspark.sql import functions as F

    condition = None
    for column in prepared.key:
        a, b = F.col(f"{left}.{quote(column)}"), F.col(f"{right}.{quote(column)}")
        term = a.eqNullSafe(b) if prepared.null_safe else a == b
        condition = term if condition is None else condition & term
    return condition


def refuse_arrived_keys_held(spark: SparkSession, prepared: PreparedChanges) -> None:
    """Fail (naming the key) when a change whose key arrived meets a row the table holds:
    the upstream would hold that key twice. Keys above the table's largest key cannot
    meet one, so usually nothing is read; otherwise the arrived keys are looked up in the
    table's files within their range."""
    from pyspark.sql import functions as F

    if prepared.table_max is EMPTY:
        return
    if _refused_in_driver(prepared):
        return
    low, high, count = arrived_key_bounds(prepared.frame, prepared.leading, prepared.table_max)
    if not count:
        return
    table = read_table(spark, prepared.uri, prepared.table_version)
    if low is not None and not prepared.changed.has_nulls:
        table = table.filter(within_bounds(F.col(quote(prepared.key[0])), low, high, prepared.leading.dataType))
    held = table.select(*(F.col(quote(k)) for k in prepared.key)).alias(TARGET).join(
        _arrived(prepared.frame, prepared.leading, prepared.table_max).select(
            *(F.col(quote(k)) for k in prepared.key)).alias(CHANGES),
        on=_same_key(prepared, TARGET, CHANGES), how="left_semi")
    # Evaluating the error expression on a held key fails the job, naming it.
    held.select(repeated_key_error(prepared.key)).limit(1).collect()


def _refused_in_driver(prepared: PreparedChanges) -> bool:
    """Whether the arrived keys were looked up among the rows the driver found for the
    changed keys (`PreparedChanges.located`), raising for one the table holds; False when
    the driver holds neither."""
    changes = local_arrow(prepared.frame)
    if prepared.located is None or changes is None:
        return False
    names = {name.lower(): name for name in prepared.schema.names}
    key = [names[column.lower()] for column in prepared.key]
    arrived = changes.filter(pc.fill_null(changes.column(ARRIVED), False)).select(key)
    held = prepared.located.rows.filter(contains(prepared.located.rows, key, arrived, key))
    if held.num_rows:
        first = held.slice(0, 1).select(key).to_pylist()[0]
        described = ", ".join(f"{column}={'NULL' if value is None else value}" for column, value in first.items())
        raise RepeatedKeyInTable(REPEATED_KEY + described)
    return True


class RepeatedKeyInTable(BackfillError):
    """An arrived key the table holds already, with the message a Spark check fails with."""


def arrived_key_bounds(changes: DataFrame, leading: StructField, table_max: Any) -> tuple[Any, Any, int]:
    """(smallest, largest, count) of the changes whose key arrived and may meet a row of a
    table whose largest `leading` key is `table_max` (None: unknown): a NULL key, or one at
    most `table_max`. The bounds are None unless the key is `boundable`. From the driver's
    Arrow rows when it holds the changes (no job), else one Spark job."""
    from pyspark.sql import functions as F

    bounded = boundable(leading.dataType)
    rows = local_arrow(changes)
    if rows is None:
        key = F.col(quote(leading.name))
        low, high = (F.min(key), F.max(key)) if bounded else (F.lit(None), F.lit(None))
        found = _arrived(changes, leading, table_max).agg(low, high, F.count(F.lit(1))).first()
        return (None, None, 0) if found is None else (found[0], found[1], int(found[2]))
    names = {name.lower(): name for name in rows.column_names}
    keys = rows.column(names[leading.name.lower()])
    wanted = pc.fill_null(rows.column(names[ARRIVED.lower()]), False)
    if table_max is not None:
        below = pc.fill_null(pc.less_equal(keys, pa.scalar(table_max, keys.type)), False)
        wanted = pc.and_(wanted, pc.or_(pc.is_null(keys), below))
    held = key_range_of_table(rows.filter(wanted), names[leading.name.lower()], names[ARRIVED.lower()])
    count = held.rows or 0
    return (held.low, held.high, count) if bounded else (None, None, count)


def _arrived(changes: DataFrame, leading: StructField, table_max: Any) -> DataFrame:
    """The changes whose key arrived and may meet a table row (see `arrived_key_bounds`)."""
    from pyspark.sql import functions as F

    arrived = changes.filter(F.col(ARRIVED))
    if table_max is None:
        return arrived
    key = F.col(quote(leading.name))
    return arrived.filter(key.isNull() | (key <= bound_literal(table_max, leading.dataType)))


def _merge_bound(prepared: PreparedChanges) -> Any:
    """A condition on the target alone that lets Delta skip the files outside the keys' range."""
    from pyspark.sql import functions as F

    if not boundable(prepared.leading.dataType):
        return None
    return prepared.changed.predicate(F.col(f"{TARGET}." + quote(prepared.leading.name)), prepared.leading.dataType)


def _refuse_unfit_way(way: str, prepared: PreparedChanges) -> None:
    """A delete only removes: it would silently drop new rows, so a plan that picks it for
    changes with new rows is a bug."""
    present, rows = prepared.changed.present_rows or 0, prepared.changed.rows or 0
    if way == DELETE and present != 0:
        raise ValueError(f"cannot {way} {rows} changed keys of which {present} have a new row: "
                         "only a merge, a replace or an overwrite writes new rows")


def cheapest_way(prepared: PreparedChanges, rates: Rates, round_plan: str = AUTO) -> str:
    """The way with the lowest estimate for these changes alone, among those the job's
    `round_plan` allows for its MV."""
    estimates = allowed_mv_ways(prepared.estimates(rates), round_plan)
    return min(estimates, key=lambda way: (estimates[way], way))


def write_keyed(
    spark: SparkSession, uri: str, changes: DataFrame, key: Sequence[str], *, app_id: str, version: int,
    user_metadata: str, null_safe: bool, round_plan: str = AUTO, rates: Rates | None = None,
) -> int:
    """Prepare, then write keyed changes the cheapest way `round_plan` allows, in one commit
    with the watermark; for writes whose way no round-level plan chose (crash recovery)."""
    prepared = prepare(spark, uri, changes, key, null_safe=null_safe)
    try:
        way = cheapest_way(prepared, rates or Rates(), round_plan)
        return write(spark, prepared, way, app_id=app_id, version=version, user_metadata=user_metadata)
    finally:
        prepared.release()
