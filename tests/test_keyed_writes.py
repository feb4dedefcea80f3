"""Every way to write keyed changes (append, replace, merge, overwrite) leaves the same rows,
moves the watermark in the same commit, is a no-op when repeated, records a change feed
that nets per key to exactly the changes, and refuses a key that arrives while the table
holds it; the cheapest way is what a write without a round plan takes; and an overwrite
keeps the same rows whether the driver or Spark computes them."""

from __future__ import annotations

import datetime
import json
from decimal import Decimal

import pytest
from deltalake import DeltaTable
from size_overrides import set_sizes

from airflow_backfill.engine.delta.commits import ARRIVED, PRESENT, TABLE_PROPERTIES
from airflow_backfill.engine.delta.driver_rows import held_in_driver
from airflow_backfill.engine.planning.round_plan import (
    APPEND,
    DELETE,
    MERGE,
    OVERWRITE,
    PATCH,
    REPLACE,
    Rates,
)
from airflow_backfill.engine.rounds import write as keyed_writes
from airflow_backfill.engine.rounds.write import cheapest_way, prepare, write, write_keyed

pytestmark = pytest.mark.spark

APP = "airflow_backfill/test"
WAYS = (MERGE, OVERWRITE)
"""The ways that apply any keyed changes (append only takes keys above the table's,
replace changes with some new row, delete only changes that all delete)."""


def create(spark, uri: str, rows: list[tuple], schema: str, **properties: str) -> None:
    writer = spark.createDataFrame(rows, schema).write.format("delta").mode("append")
    for key, value in {**TABLE_PROPERTIES, **properties}.items():
        writer = writer.option(key, value)
    writer.option("txnAppId", APP).option("txnVersion", "0").save(uri)


def changes(spark, rows: list[tuple], schema: str, *, arrived: bool = False):
    """Keyed changes: a row with `__present` true is upserted, one with NULL deletes its key."""
    extra = f", {ARRIVED} boolean" if arrived else ""
    return spark.createDataFrame(rows, f"{schema}, {PRESENT} boolean{extra}")


def write_as(spark, way: str, uri: str, frame, version: int, key=("k",), null_safe: bool = False) -> int:
    if way == PATCH:  # a patch writes changes the driver holds, as a round's small changes are
        frame = held_in_driver(frame)
    prepared = prepare(spark, uri, frame, key, null_safe=null_safe)
    try:
        return write(spark, prepared, way, app_id=APP, version=version, user_metadata="{}")
    finally:
        prepared.release()


def rows_of(spark, uri: str) -> list[tuple]:
    return sorted((tuple(r) for r in spark.read.format("delta").load(uri).collect()),
                  key=lambda r: tuple((v is not None, v) for v in r))


def feed_rows(spark, uri: str, version: int) -> list:
    return (spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", version)
            .option("endingVersion", version).load(uri)).collect()


def netted_feed(spark, uri: str, version: int, key: tuple[str, ...] = ("k",)) -> dict:
    """The version's change feed netted per key: key -> its new row, or None when it left;
    keys whose row is the same before and after are left out."""
    feed = (spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", version)
            .option("endingVersion", version).load(uri)).collect()
    columns = [c for c in feed[0].asDict() if not c.startswith("_")] if feed else []
    before: dict = {}
    after: dict = {}
    for row in feed:
        values = tuple(row[c] for c in columns)
        ident = tuple(row[c] for c in key)
        if row["_change_type"] in ("delete", "update_preimage"):
            before[ident] = values
        else:
            after[ident] = values
    return {k: after.get(k) for k in before.keys() | after.keys() if before.get(k) != after.get(k)}


UPSERTS = [(5, "five", True), (20, "twenty", True), (6, "v6", True)]
DELETES = [(3, None, None), (99, None, None)]
CASES = {
    "mixed": (UPSERTS + DELETES, (PATCH, REPLACE, MERGE, OVERWRITE)),
    "upserts": (UPSERTS, (PATCH, REPLACE, MERGE, OVERWRITE)),
    "deletes": (DELETES, (PATCH, DELETE, MERGE, OVERWRITE)),
}
"""Changes of each kind and the ways that apply them (a delete needs every change to leave;
a replace needs some new row, and deletes the keys without one)."""


@pytest.mark.parametrize(("kind", "way"), [(kind, way) for kind, (_, ways) in CASES.items() for way in ways])
def test_every_way_leaves_the_same_rows_watermark_and_netted_feed(spark, tmp_path, kind, way):
    uri = str(tmp_path / "mv")
    create(spark, uri, [(k, f"v{k}") for k in range(1, 11)], "k int, v string")
    rows = CASES[kind][0]

    assert write_as(spark, way, uri, changes(spark, rows, "k int, v string"), version=1) == len(rows)

    expected = {k: f"v{k}" for k in range(1, 11)}
    for key, value, present in rows:
        if present:
            expected[key] = value
        else:
            expected.pop(key, None)
    assert rows_of(spark, uri) == sorted(expected.items())
    assert DeltaTable(uri).transaction_version(APP) == 1
    changed = {(k,): (None if not present else (k, v)) for k, v, present in rows if (k, v) != (6, "v6") and k != 99}
    assert netted_feed(spark, uri, 1) == changed
    if way == PATCH:  # written by the driver: its own change file, no row kept as it was rewritten
        actions = [json.loads(line) for line in (tmp_path / "mv" / "_delta_log" / f"{1:020d}.json").read_text().splitlines()]
        assert any("cdc" in action for action in actions)
        info = next(action["commitInfo"] for action in actions if "commitInfo" in action)
        assert "rows replaced by" in info["operationParameters"]["predicate"]
        held = {k: f"v{k}" for k in range(1, 11)}
        images = sum((2 if k in held else 1) if present else 1 for k, v, present in rows
                     if (held.get(k) != v) and (present or k in held))
        assert len(feed_rows(spark, uri, 1)) == images  # two rows per changed row, none for the unchanged
    # The same version again changes nothing: the watermark tells.
    assert write_as(spark, way, uri, changes(spark, [(1, None, None)], "k int, v string"), version=1) == 0
    assert len(rows_of(spark, uri)) == len(expected)
    assert DeltaTable(uri).version() == 1


def test_a_round_of_new_keys_above_the_table_is_an_append_and_the_cheapest_way(spark, tmp_path):
    uri = str(tmp_path / "mv")
    create(spark, uri, [(k, f"v{k}") for k in range(1, 11)], "k long, v string")
    frame = changes(spark, [(11, "new", True), (12, "new", True), (13, None, None)], "k long, v string")

    prepared = prepare(spark, uri, frame, ("k",), null_safe=False)
    try:
        assert prepared.facts.new_keys_only
        assert cheapest_way(prepared, Rates()) == APPEND
        write(spark, prepared, APPEND, app_id=APP, version=1, user_metadata="{}")
    finally:
        prepared.release()

    assert DeltaTable(uri).history(limit=1)[0]["operation"] == "WRITE"
    assert rows_of(spark, uri) == [(k, f"v{k}") for k in range(1, 11)] + [(11, "new"), (12, "new")]
    assert netted_feed(spark, uri, 1) == {(11,): (11, "new"), (12,): (12, "new")}


@pytest.mark.parametrize("ways", [(REPLACE, DELETE), (MERGE, MERGE), (OVERWRITE, OVERWRITE), (PATCH, PATCH)])
def test_null_keys_match_null_safely(spark, tmp_path, ways):
    uri = str(tmp_path / "state")
    create(spark, uri, [(None, 1), (1, 1), (2, 1)], "k int, n long")
    upserting, deleting = ways

    write_as(spark, upserting, uri, changes(spark, [(None, 5, True), (9, 1, True)], "k int, n long"), version=1,
             null_safe=True)
    assert rows_of(spark, uri) == [(None, 5), (1, 1), (2, 1), (9, 1)]
    write_as(spark, deleting, uri, changes(spark, [(None, None, None), (2, None, None)], "k int, n long"),
             version=2, null_safe=True)
    assert rows_of(spark, uri) == [(1, 1), (9, 1)]
    assert netted_feed(spark, uri, 2) == {(None,): None, (2,): None}


@pytest.mark.parametrize("ways", [(REPLACE, DELETE), (MERGE, MERGE), (OVERWRITE, OVERWRITE), (PATCH, PATCH)])
def test_composite_date_and_string_keys(spark, tmp_path, ways):
    uri = str(tmp_path / "mv")
    day = datetime.date(2024, 1, 1)
    schema = "d date, name string, x int"
    create(spark, uri, [(day, "a'b", 1), (day, "c\\d", 2), (day + datetime.timedelta(1), "a'b", 3)], schema)
    upserting, deleting = ways

    write_as(spark, upserting, uri, changes(spark, [(day, "c\\d", 20, True), (day, "new", 4, True)], schema),
             version=1, key=("d", "name"))
    write_as(spark, deleting, uri, changes(spark, [(day + datetime.timedelta(1), "a'b", None, None)], schema),
             version=2, key=("d", "name"))

    assert rows_of(spark, uri) == [(day, "a'b", 1), (day, "c\\d", 20), (day, "new", 4)]
    assert netted_feed(spark, uri, 1, ("d", "name")) == {(day, "c\\d"): (day, "c\\d", 20), (day, "new"): (day, "new", 4)}
    assert netted_feed(spark, uri, 2, ("d", "name")) == {(day + datetime.timedelta(1), "a'b"): None}


@pytest.mark.parametrize("way", (REPLACE, MERGE, OVERWRITE, PATCH))
def test_a_key_that_arrives_while_the_table_holds_it_is_refused_and_nothing_is_written(spark, tmp_path, way):
    uri = str(tmp_path / "mv")
    create(spark, uri, [(k, f"v{k}") for k in range(1, 6)], "k long, v string")
    frame = changes(spark, [(3, "again", True, True), (4, "four", True, False)], "k long, v string", arrived=True)

    with pytest.raises(Exception, match="upstream key repeated: k=3"):
        write_as(spark, way, uri, frame, version=1)
    assert DeltaTable(uri).version() == 0

    # A key that arrives and is new to the table is written.
    write_as(spark, way, uri, changes(spark, [(2, "two", True, False), (7, "seven", True, True)],
                                      "k long, v string", arrived=True), version=1)
    assert rows_of(spark, uri) == [(1, "v1"), (2, "two"), (3, "v3"), (4, "v4"), (5, "v5"), (7, "seven")]


@pytest.mark.parametrize("way", (REPLACE, OVERWRITE, PATCH))
def test_date_keys_of_the_first_millennium_are_looked_up_and_refused_when_held(spark, tmp_path, way):
    """The arrived keys' bounds reach Spark as DATE literals: PySpark's own conversion of
    a date before the year 1000 fails."""
    uri = str(tmp_path / "mv")
    early = [datetime.date(1, 1, 1), datetime.date(999, 12, 31), datetime.date(2000, 1, 1)]
    create(spark, uri, [(day, day.year) for day in early], "d date, v int")
    again = changes(spark, [(early[1], -1, True, True), (datetime.date(5, 5, 5), 5, True, True)], "d date, v int",
                    arrived=True)
    with pytest.raises(Exception, match="upstream key repeated: d=0999-12-31"):
        write_as(spark, way, uri, again, version=1, key=("d",))
    assert DeltaTable(uri).version() == 0

    new = changes(spark, [(datetime.date(5, 5, 5), 5, True, True), (early[0], 0, True, False)], "d date, v int",
                  arrived=True)
    write_as(spark, way, uri, new, version=1, key=("d",))
    assert rows_of(spark, uri) == [(early[0], 0), (datetime.date(5, 5, 5), 5), (early[1], 999), (early[2], 2000)]


def test_a_small_table_is_overwritten_and_a_large_one_replaced_or_deleted_from(spark, tmp_path):
    uri = str(tmp_path / "mv")
    create(spark, uri, [(k, k) for k in range(1, 101)], "k long, v long")
    frame = changes(spark, [(50, 0, True)], "k long, v long")
    # The same changes against a table a hundred thousand times larger (its rows costlier to read).
    larger = Rates(per_read_row=Rates().per_read_row * 100_000)

    prepared = prepare(spark, uri, frame, ("k",), null_safe=False)
    try:
        assert prepared.facts.rows == 100
        assert cheapest_way(prepared, Rates()) == OVERWRITE
        assert cheapest_way(prepared, larger) == REPLACE
    finally:
        prepared.release()
    deleted = prepare(spark, uri, changes(spark, [(7, None, None)], "k long, v long"), ("k",), null_safe=False)
    try:
        assert cheapest_way(deleted, larger) == DELETE
    finally:
        deleted.release()
    write_keyed(spark, uri, frame, ("k",), app_id=APP, version=1, user_metadata="{}", null_safe=False)
    assert rows_of(spark, uri)[49] == (50, 0)


@pytest.mark.parametrize("table", ["deletion vectors", "no deletion vectors", "held keys"])
def test_a_replace_of_mixed_changes_deletes_the_keys_without_a_new_row(spark, tmp_path, table):
    """Keys that leave and keys with new rows, replaced in one commit: from the table's file
    list by a semi-join with every changed key (deletion vectors), by a condition of
    literals when the driver holds a few keys, and by a MERGE where deletion vectors are off."""
    uri = str(tmp_path / "mv")
    properties = {"delta.enableDeletionVectors": "false"} if table == "no deletion vectors" else {}
    create(spark, uri, [(k, f"v{k}") for k in range(1, 11)], "k int, v string", **properties)
    frame = changes(spark, [(2, "two", True), (4, None, None), (12, "twelve", True), (7, None, None)], "k int, v string")

    write_as(spark, REPLACE, uri, held_in_driver(frame) if table == "held keys" else frame, version=1)

    assert rows_of(spark, uri) == [(1, "v1"), (2, "two"), (3, "v3"), (5, "v5"), (6, "v6"), (8, "v8"), (9, "v9"),
                                   (10, "v10"), (12, "twelve")]
    assert netted_feed(spark, uri, 1) == {(2,): (2, "two"), (4,): None, (7,): None, (12,): (12, "twelve")}
    commit = DeltaTable(uri).history(limit=1)[0]
    if table == "no deletion vectors":
        assert commit["operation"] == "MERGE"
    else:
        predicate = commit["operationParameters"]["predicate"]
        assert commit["operation"] == "WRITE"
        assert ("EXISTS" in predicate) == (table == "deletion vectors")


def test_a_merge_that_only_deletes_has_one_delete_clause_and_a_feed_of_the_deleted_keys(spark, tmp_path):
    uri = str(tmp_path / "mv")
    create(spark, uri, [(k, f"v{k}") for k in range(1, 11)], "k long, v string")

    write_as(spark, MERGE, uri, changes(spark, [(3, None, None), (7, None, None)], "k long, v string"), version=1)

    merge = DeltaTable(uri).history(limit=1)[0]
    assert merge["operation"] == "MERGE"
    assert json.loads(merge["operationParameters"]["matchedPredicates"]) == [{"actionType": "delete"}]
    assert json.loads(merge["operationParameters"]["notMatchedPredicates"]) == []
    assert netted_feed(spark, uri, 1) == {(3,): None, (7,): None}
    assert [k for k, _ in rows_of(spark, uri)] == [1, 2, 4, 5, 6, 8, 9, 10]


KEPT_CASES = {
    "null-safe": ("k int, n long", [(None, 1), (1, 1), (2, 1)], [(None, 5, True), (2, None, None)], True, True),
    "not null-safe": ("k int, n long", [(None, 1), (1, 1)], [(None, 5, True), (1, None, None)], False, True),
    "decimal and string": ("d decimal(10,2), s string, n long", [(Decimal("1.50"), "a", 1), (Decimal("2.00"), "a", 2)],
                           [(Decimal("1.5"), "a", 9, True)], False, True),
    "double key": ("k double, n long", [(1.5, 1), (float("nan"), 2)], [(float("nan"), 7, True)], True, False),
    "empty table": ("k int, n long", [], [(1, 5, True)], False, True),
}
"""Per case: schema, table rows, keyed changes, null-safe keys, and whether the driver
computes the rows an overwrite keeps (not for floating-point keys)."""


@pytest.mark.parametrize("case", KEPT_CASES)
def test_an_overwrite_keeps_the_same_rows_whether_the_driver_or_spark_computes_them(spark, tmp_path, monkeypatch,
                                                                                     case):
    schema, rows, changed, null_safe, in_driver = KEPT_CASES[case]
    key = tuple(field.split()[0] for field in schema.split(", ")[:-1])
    original = keyed_writes._split_in_driver
    results = {}
    for computed_by in ("driver", "spark"):
        uri = str(tmp_path / computed_by)
        create(spark, uri, rows, schema)
        calls: list[bool] = []

        def spied(*args, calls=calls, allowed=computed_by == "driver"):
            kept = original(*args) if allowed else None
            calls.append(kept is not None)
            return kept

        monkeypatch.setattr(keyed_writes, "_split_in_driver", spied)
        held = held_in_driver(changes(spark, changed, schema))  # as a round's few changes are
        write_as(spark, OVERWRITE, uri, held, version=1, key=key, null_safe=null_safe)
        assert calls == [computed_by == "driver" and in_driver]
        feed = netted_feed(spark, uri, 1, key)
        results[computed_by] = repr(rows_of(spark, uri)), sorted(repr(item) for item in feed.items())
    assert results["driver"] == results["spark"]  # as repr: NaN equals itself there


LITERAL_SCHEMA = "k long, d date, s string, c decimal(10,2), b boolean, v string"
LITERAL_KEY = ("k", "d", "s", "c", "b")


@pytest.mark.parametrize("found_by", ["literals", "semi-join"])
def test_a_few_keys_are_found_by_literals_and_leave_what_a_semi_join_leaves(spark, tmp_path, monkeypatch, found_by):
    """A replace and a delete of a few driver-held keys filter the table by the keys written
    out as literals; with more keys than `sizes.literal_keys` they join (EXISTS). Rows, feed and watermark are the same either way, NULL key
    parts (null-safe) included."""
    if found_by == "semi-join":
        set_sizes(monkeypatch, literal_keys=0)
    uri = str(tmp_path / "mv")
    day = datetime.date(2024, 2, 29)
    rows = [(k, day + datetime.timedelta(k % 3), f"s{k % 4}", Decimal(k) / 4, k % 2 == 0, f"v{k}") for k in range(12)]
    rows.append((None, day, None, None, None, "all null"))
    create(spark, uri, rows, LITERAL_SCHEMA)
    replaced = [(*rows[3][:5], "new3", True), (*rows[8][:5], "new8", True), (*rows[-1][:5], "new null", True),
                (50, day, "s", Decimal("0.25"), False, "new50", True)]
    deleted = [(*rows[5][:5], None, None), (*rows[-1][:5], None, None), (77, day, "x", Decimal(1), True, None, None)]

    write_as(spark, REPLACE, uri, held_in_driver(changes(spark, replaced, LITERAL_SCHEMA)), version=1,
             key=LITERAL_KEY, null_safe=True)
    write_as(spark, DELETE, uri, held_in_driver(changes(spark, deleted, LITERAL_SCHEMA)), version=2,
             key=LITERAL_KEY, null_safe=True)

    expected = {row[:5]: row for row in rows}
    expected.update({row[:5]: row[:6] for row in replaced})
    for row in deleted:
        expected.pop(row[:5], None)
    assert rows_of(spark, uri) == sorted(expected.values(), key=lambda r: tuple((v is not None, v) for v in r))
    assert netted_feed(spark, uri, 1, LITERAL_KEY) == {row[:5]: row[:6] for row in replaced}
    assert netted_feed(spark, uri, 2, LITERAL_KEY) == {rows[5][:5]: None, rows[-1][:5]: None}
    assert DeltaTable(uri).transaction_version(APP) == 2
    for commit in DeltaTable(uri).history(limit=2):
        condition = commit["operationParameters"]["predicate"]
        if found_by == "literals":
            assert "`k` IS NULL AND `d` = DATE'2024-02-29'" in condition and "EXISTS" not in condition
        else:
            assert condition.startswith("EXISTS (SELECT 1 FROM")


def test_a_replace_of_a_key_with_a_null_part_compared_by_equality_joins(spark, tmp_path):
    """With `=`, a NULL key part matches nothing: the new row is added beside the old one,
    which a condition of literals could not express (its new row would not meet it)."""
    uri = str(tmp_path / "mv")
    create(spark, uri, [(None, 1), (1, 1)], "k int, n long")
    write_as(spark, REPLACE, uri, held_in_driver(changes(spark, [(None, 5, True), (1, 2, True)], "k int, n long")),
             version=1)
    assert rows_of(spark, uri) == [(None, 1), (None, 5), (1, 2)]
    assert "EXISTS" in DeltaTable(uri).history(limit=1)[0]["operationParameters"]["predicate"]


NARROWED_SCHEMA = "k long, n int, v string"


@pytest.mark.parametrize(("null_safe", "null_leading_change"), [(False, True), (True, False), (True, True)])
@pytest.mark.parametrize("changed", ["mixed", "upserts", "deletes"])
def test_a_key_of_several_columns_is_matched_on_its_integral_leading_column_first_when_that_drops_no_match(
        spark, tmp_path, monkeypatch, changed, null_safe, null_leading_change):
    """Spark probes one integral column far faster than several (docs/benchmarks.md), so a
    semi-join by a composite key first joins on its leading column; never where `<=>`
    could match a NULL leading column (a change with one). Rows and feed are the same."""
    set_sizes(monkeypatch, literal_keys=0)  # the semi-join, not literals
    uri = str(tmp_path / "mv")
    table = [(k, n, f"v{k}.{n}") for k in range(1, 6) for n in (1, 2)] + [(None, 1, "null.1"), (None, 2, "null.2")]
    create(spark, uri, table, NARROWED_SCHEMA)
    upserts = [(2, 1, "new2.1", True), (9, 1, "new9.1", True)]
    deletes = [(3, 2, None, None), (4, 1, None, None)]
    null_leading = [(None, 2, "new null.2", True)] if changed != "deletes" else [(None, 2, None, None)]
    rows = {"mixed": upserts + deletes, "upserts": upserts, "deletes": deletes}[changed]
    rows = rows + (null_leading if null_leading_change else [])
    way = DELETE if changed == "deletes" else REPLACE

    write_as(spark, way, uri, held_in_driver(changes(spark, rows, NARROWED_SCHEMA)), version=1, key=("k", "n"),
             null_safe=null_safe)

    expected = {(k, n): (k, n, v) for k, n, v in table}
    replaced = {}
    for k, n, v, present in rows:
        if k is None and not null_safe:  # `=`: a NULL key part matches nothing
            if present:
                replaced[(k, n, v)] = (k, n, v)
            continue
        expected.pop((k, n), None)
        if present:
            expected[(k, n)] = (k, n, v)
    after = sorted([*expected.values(), *replaced.values()], key=lambda r: tuple((x is not None, x) for x in r))
    assert rows_of(spark, uri) == after
    deleted_by_feed = {key for key, row in netted_feed(spark, uri, 1, ("k", "n")).items() if row is None}
    assert deleted_by_feed == {(k, n) for k, n, _, present in rows if not present and (k is not None or null_safe)}
    condition = DeltaTable(uri).history(limit=1)[0]["operationParameters"]["predicate"]
    narrowed = not (null_safe and null_leading_change)
    assert condition.count("EXISTS (SELECT 1 FROM") == (2 if narrowed else 1)


def test_deltas_own_delete_takes_the_narrowed_condition_too(spark, tmp_path, monkeypatch):
    """A table whose checksum lists no files is deleted from by Delta's DELETE, with the
    same two semi-joins."""
    set_sizes(monkeypatch, literal_keys=0)
    uri = str(tmp_path / "mv")
    threshold = "spark.databricks.delta.allFilesInCrc.thresholdNumFiles"
    kept = spark.conf.get(threshold)
    spark.conf.set(threshold, "0")  # the checksum lists no file: the write cannot go by the list
    try:
        create(spark, uri, [(k, n, f"v{k}.{n}") for k in range(1, 4) for n in (1, 2)], NARROWED_SCHEMA)
    finally:
        spark.conf.set(threshold, kept)
    deletes = [(2, 1, None, None), (3, 2, None, None), (7, 1, None, None)]

    write_as(spark, DELETE, uri, held_in_driver(changes(spark, deletes, NARROWED_SCHEMA)), version=1, key=("k", "n"))

    assert rows_of(spark, uri) == [(1, 1, "v1.1"), (1, 2, "v1.2"), (2, 2, "v2.2"), (3, 1, "v3.1")]
    commit = DeltaTable(uri).history(limit=1)[0]
    assert commit["operation"] == "DELETE"
    assert commit["operationParameters"]["predicate"].count("exists#") == 2  # Delta records the resolved plan
