"""The pure functions under a round's driver paths, held to plain references over generated
inputs (hypothesis): netting a feed per key, folding signed terms per group, a key range,
and finding rows by key NULL-safely. No Spark: these are the functions whose results the
differential harness (tests/test_differential.py) then holds to Spark's through whole
rounds."""

from __future__ import annotations

from collections import defaultdict
from decimal import Decimal

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_backfill.engine.aggregates.driver_fold import combine_terms
from airflow_backfill.engine.delta.commits import ARRIVED
from airflow_backfill.engine.delta.key_lookup import contains, matching_rows
from airflow_backfill.engine.delta.key_range import KeyRange, key_range_of_table
from airflow_backfill.engine.rounds.changes import BEFORE, CHANGE_RANK, DELETED, HELD_BEFORE
from airflow_backfill.engine.rounds.netting import RepeatedKey, net_feed

ARRIVING, LEAVING = ("insert", "update_postimage"), ("delete", "update_preimage")
FEED_SCHEMA = pa.schema([pa.field("k", pa.int64()), pa.field("tag", pa.string()), pa.field("v", pa.int32()),
                         pa.field("_change_type", pa.string()), pa.field("_commit_version", pa.int64())])


# ---- netting -----------------------------------------------------------------------------


@st.composite
def feeds(draw) -> list[dict]:
    """Change rows of a table keyed by (k, tag) over a few commits, as Delta's feed shows
    them: inserts, deletes, updates in place, updates that move a row to another key, a row
    removed and added again within a commit; now and then a second row for a held key."""
    keys = [(k, tag) for k in range(4) for tag in ("a", None)]
    held: dict[tuple, int] = {}
    rows = []
    for version in range(1, draw(st.integers(1, 5)) + 1):
        touched: set = set()
        for _ in range(draw(st.integers(0, 4))):
            free = [key for key in keys if key not in held and key not in touched]
            mine = [key for key in held if key not in touched]
            action = draw(st.sampled_from(["insert", "delete", "update", "move", "rewrite", "repeat"]))
            value = draw(st.integers(-5, 5))
            if action == "insert" and free:
                key = draw(st.sampled_from(free))
                held[key] = value
                rows.append((*key, value, "insert", version))
            elif action == "delete" and mine:
                key = draw(st.sampled_from(mine))
                rows.append((*key, held.pop(key), "delete", version))
            elif action == "update" and mine:
                key = draw(st.sampled_from(mine))
                rows += [(*key, held[key], "update_preimage", version), (*key, value, "update_postimage", version)]
                held[key] = value
            elif action == "move" and mine and free:
                old, new = draw(st.sampled_from(mine)), draw(st.sampled_from(free))
                rows += [(*old, held.pop(old), "update_preimage", version), (*new, value, "update_postimage", version)]
                held[new] = value
                touched.add(new)
            elif action == "rewrite" and mine:
                key = draw(st.sampled_from(mine))
                rows += [(*key, held[key], "delete", version), (*key, held[key], "insert", version)]
            elif action == "repeat" and mine:
                rows.append((*draw(st.sampled_from(mine)), value, "insert", version))
            else:
                continue
            touched.update(key for key in keys if any(row[:2] == key and row[4] == version for row in rows))
    names = FEED_SCHEMA.names
    return [dict(zip(names, row, strict=True)) for row in draw(st.permutations(rows))]


def reference_net(rows: list[dict]) -> dict[tuple, dict] | tuple:
    """Netting written plainly: per key, newest commit first, the surviving image first."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        groups[(row["k"], row["tag"])].append(row)
    netted = {}
    for key, group in groups.items():
        group.sort(key=lambda r: (-r["_commit_version"], -CHANGE_RANK[r["_change_type"]]))
        signs = [1 if r["_change_type"] in ARRIVING else -1 for r in group]
        total = sum(signs)
        counts, running = [], 0
        for sign in signs:
            running += sign
            counts.append(total - running)
        if max(*counts, total) - min(*counts, total) > 1:
            return ("repeated", key)
        latest, earliest = group[0], group[-1]
        netted[key] = {"v": latest["v"], DELETED: latest["_change_type"] in LEAVING, ARRIVED: total == 1,
                       BEFORE: {"k": earliest["k"], "tag": earliest["tag"], "v": earliest["v"]},
                       HELD_BEFORE: earliest["_change_type"] in LEAVING}
    return netted


@settings(max_examples=300, deadline=None)
@given(feeds())
def test_arrow_netting_equals_the_plain_reference(rows):
    expected = reference_net(rows)
    found = net_feed(pa.Table.from_pylist(rows, schema=FEED_SCHEMA), ("k", "tag"), refuse_repeated_keys=True)
    if isinstance(expected, tuple):
        assert isinstance(found, RepeatedKey)
        return
    assert not isinstance(found, RepeatedKey)
    got = {(row["k"], row["tag"]): {name: row[name] for name in ("v", DELETED, ARRIVED, BEFORE, HELD_BEFORE)}
           for row in found.to_pylist()}
    assert got == expected


@settings(max_examples=100, deadline=None)
@given(feeds())
def test_without_the_key_check_a_repeated_key_is_netted_too(rows):
    found = net_feed(pa.Table.from_pylist(rows, schema=FEED_SCHEMA), ("k", "tag"), refuse_repeated_keys=False)
    assert not isinstance(found, RepeatedKey)
    assert found.num_rows == len({(row["k"], row["tag"]) for row in rows})


# ---- folding terms per group ---------------------------------------------------------------


TERMS = pa.schema([pa.field("g", pa.string()), pa.field("n", pa.int64()), pa.field("s", pa.decimal128(20, 2)),
                   pa.field("lo", pa.int32()), pa.field("hi", pa.string())])
COMBINES = {"n": "sum", "s": "sum", "lo": "min", "hi": "max"}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(
    st.sampled_from(["x", "y", "ü", ""]), st.integers(-(2**40), 2**40),
    st.one_of(st.none(), st.decimals(min_value=-10**6, max_value=10**6, places=2, allow_nan=False)),
    st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1)), st.one_of(st.none(), st.text(max_size=3)))))
def test_folded_terms_equal_the_plain_reference(rows):
    terms = pa.Table.from_pylist([dict(zip(TERMS.names, row, strict=True)) for row in rows], schema=TERMS)
    combined = combine_terms(terms, ["g"], COMBINES)
    assert combined is not None
    expected: dict[str, dict] = {}
    for g, n, s, lo, hi in rows:
        group = expected.setdefault(g, {"n": 0, "s": None, "lo": None, "hi": None})
        group["n"] += n
        if s is not None:
            group["s"] = (group["s"] or Decimal(0)) + s
        if lo is not None:
            group["lo"] = lo if group["lo"] is None else min(group["lo"], lo)
        if hi is not None:
            group["hi"] = hi if group["hi"] is None else max(group["hi"], hi, key=lambda text: text.encode())
    assert {row.pop("g"): row for row in combined.to_pylist()} == expected


def test_terms_arrow_would_combine_otherwise_are_left_to_spark():
    floats = pa.table({"g": ["a", "a"], "x": pa.array([1.5, float("nan")], pa.float64())})
    assert combine_terms(floats, ["g"], {"x": "sum"}) is not None  # any order of adding gives NaN here
    near_overflow = pa.table({"g": ["a", "a", "a"], "x": pa.array([1.7e308, 1.7e308, -1.7e308], pa.float64())})
    assert combine_terms(near_overflow, ["g"], {"x": "sum"}) is None  # one order overflows, another does not
    null_key = pa.table({"g": pa.array([None], pa.string()), "x": pa.array([1], pa.int64())})
    assert combine_terms(null_key, ["g"], {"x": "sum"}) is None  # joined with `<=>` later
    huge = pa.table({"g": ["a", "a"], "x": pa.array([2**62, 2**62], pa.int64())})
    assert combine_terms(huge, ["g"], {"x": "sum"}) is None  # could overflow: Spark raises


# ---- key ranges and lookups ---------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)), st.booleans(),
                          st.one_of(st.none(), st.booleans()))))
def test_a_key_range_of_arrow_rows_equals_the_plain_reference(rows):
    table = pa.table({"k": pa.array([r[0] for r in rows], pa.int64()),
                      "p": pa.array([True if r[1] else None for r in rows], pa.bool_()),
                      "f": pa.array([r[2] for r in rows], pa.bool_())})
    keys = [r[0] for r in rows if r[0] is not None]
    assert key_range_of_table(table, "k", "p", "f") == KeyRange(
        "k", min(keys, default=None), max(keys, default=None), len(keys) < len(rows), sum(r[1] for r in rows),
        len(rows), sum(bool(r[2]) for r in rows))


KEYS = st.tuples(st.one_of(st.none(), st.integers(0, 3)), st.one_of(st.none(), st.sampled_from(["a", "b"])))


@settings(max_examples=200, deadline=None)
@given(st.lists(KEYS, max_size=12), st.lists(KEYS, max_size=12, unique=True))
def test_rows_are_found_by_key_as_spark_finds_them_with_null_safe_equality(left, right):
    def table(rows):
        return pa.table({"a": pa.array([r[0] for r in rows], pa.int64()), "b": pa.array([r[1] for r in rows], pa.string())})

    found = matching_rows(table(left), ["a", "b"], table(right), ["a", "b"]).to_pylist()
    assert found == [right.index(row) if row in right else None for row in left]
    assert contains(table(left), ["a", "b"], table(right), ["a", "b"]).to_pylist() == [row in right for row in left]
