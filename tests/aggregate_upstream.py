"""A small live upstream for the aggregate tests, written with delta-rs only.

Every epoch is one Delta MERGE (one upstream version) mixing inserts, updates that may
move a row to another group, updates of the primary key, deletes and NULLs, so the
change feed carries every `_change_type`. Values are integers, decimals and binary
fractions (multiples of 1/4), so sums are exact in every engine.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from hypothesis import strategies as st

SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False),
    pa.field("g", pa.string()),
    pa.field("h", pa.int32()),
    pa.field("x", pa.int64()),
    pa.field("d", pa.decimal128(7, 2)),
    pa.field("f", pa.float64()),
    pa.field("s", pa.string()),
])
_MERGE_SCHEMA = SCHEMA.append(pa.field("_op", pa.string())).append(pa.field("_match", pa.int64()))

G_VALUES = ("a", "b", "c", None)
H_VALUES = (0, 1, None)
S_VALUES = ("p", "q", "r", None)

Op = tuple[str, int, dict[str, Any]]
"""(kind, index of an existing row (insert: unused), new values); kinds: insert, update, rekey, delete."""


@dataclass
class Upstream:
    """The upstream table and a model of its rows (to pick rows to change)."""

    uri: str
    rows: dict[int, dict[str, Any]] = field(default_factory=dict)
    next_id: int = 0

    def version(self) -> int:
        return DeltaTable(self.uri).version()


def _decimal(cents: int | None) -> Decimal | None:
    return None if cents is None else Decimal(cents).scaleb(-2)


def values(rng: random.Random) -> dict[str, Any]:
    """Random non-key values for one row (about a fifth of them NULL)."""
    def maybe(value: Any) -> Any:
        return None if rng.random() < 0.2 else value

    return {
        "g": rng.choice(G_VALUES), "h": rng.choice(H_VALUES), "x": maybe(rng.randint(-5, 5)),
        "d": _decimal(maybe(rng.randint(-999, 999))), "f": maybe(rng.randint(-8, 8) / 4),
        "s": rng.choice(S_VALUES),
    }


def row_values() -> st.SearchStrategy[dict[str, Any]]:
    """The hypothesis version of `values`."""
    return st.fixed_dictionaries({
        "g": st.sampled_from(G_VALUES), "h": st.sampled_from(H_VALUES),
        "x": st.none() | st.integers(-5, 5),
        "d": st.none() | st.integers(-999, 999).map(_decimal),
        "f": st.none() | st.integers(-8, 8).map(lambda n: n / 4),
        "s": st.sampled_from(S_VALUES),
    })


def epoch_ops() -> st.SearchStrategy[list[Op]]:
    """One epoch: 1 to 4 operations."""
    op = st.tuples(st.sampled_from(("insert", "insert", "update", "rekey", "delete")),
                   st.integers(0, 1000), row_values())
    return st.lists(op, min_size=1, max_size=4)


def random_ops(rng: random.Random, count: int = 4) -> list[Op]:
    kinds = ("insert", "insert", "update", "rekey", "delete")
    return [(rng.choice(kinds), rng.randint(0, 1000), values(rng)) for _ in range(rng.randint(1, count))]


def create(uri: str, initial: list[dict[str, Any]]) -> Upstream:
    """Version 0 with `initial` rows (ids assigned), Change Data Feed on."""
    upstream = Upstream(uri)
    for row in initial:
        upstream.rows[upstream.next_id] = {"id": upstream.next_id, **row}
        upstream.next_id += 1
    table = pa.Table.from_pylist(list(upstream.rows.values()), schema=SCHEMA)
    write_deltalake(uri, table, configuration={"delta.enableChangeDataFeed": "true"})
    return upstream


def apply_epoch(upstream: Upstream, ops: list[Op]) -> bool:
    """Apply `ops` as one MERGE; False when they change nothing (no new version)."""
    source: list[dict[str, Any]] = []
    touched: set[int] = set()
    for kind, index, new_values in ops:
        live = sorted(set(upstream.rows) - touched)
        if kind == "insert" or not live:
            row = {"id": upstream.next_id, **new_values}
            upstream.next_id += 1
            source.append({**row, "_op": "upsert", "_match": row["id"]})
            upstream.rows[row["id"]] = row
            touched.add(row["id"])
            continue
        old_id = live[index % len(live)]
        touched.add(old_id)
        if kind == "delete":
            source.append({**upstream.rows.pop(old_id), "_op": "delete", "_match": old_id})
            continue
        new_id = old_id
        if kind == "rekey":
            new_id = upstream.next_id
            upstream.next_id += 1
            del upstream.rows[old_id]
        row = {"id": new_id, **new_values}
        upstream.rows[new_id] = row
        touched.add(new_id)
        source.append({**row, "_op": "upsert", "_match": old_id})
    before = upstream.version()
    columns = {name: f"s.{name}" for name in SCHEMA.names}
    (
        DeltaTable(upstream.uri)
        .merge(pa.Table.from_pylist(source, schema=_MERGE_SCHEMA), predicate="t.id = s._match",
               source_alias="s", target_alias="t")
        .when_matched_delete(predicate="s._op = 'delete'")
        .when_matched_update(updates=columns, predicate="s._op = 'upsert'")
        .when_not_matched_insert(updates=columns, predicate="s._op = 'upsert'")
        .execute()
    )
    return upstream.version() > before
