"""Small live upstreams for the join tests, written with delta-rs only.

Three tables linked by keys, like TPC-H's: `customer(c_id)`, `orders(o_id, o_cust ->
customer)`, `items(i_order -> orders, i_line)`, plus `nation(n_id)` for a fourth. Foreign
keys are drawn from a small range that includes keys with no row, so inner joins lose
rows, LEFT JOINs pad them, and updates of a foreign key make matches appear and vanish.
Each `commit` is one delta-rs MERGE (one upstream version) of upserts and deletes, so
the change feed carries inserts, pre/post images and deletes. Values are integers and
decimals, so sums are exact in every engine.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

SCHEMAS = {
    "nation": (pa.schema([pa.field("n_id", pa.int64(), nullable=False), pa.field("n_name", pa.string())]), ("n_id",)),
    "customer": (pa.schema([
        pa.field("c_id", pa.int64(), nullable=False), pa.field("c_nation", pa.int64()),
        pa.field("c_segment", pa.string()), pa.field("c_name", pa.string()),
    ]), ("c_id",)),
    "orders": (pa.schema([
        pa.field("o_id", pa.int64(), nullable=False), pa.field("o_cust", pa.int64()),
        pa.field("o_status", pa.string()), pa.field("o_day", pa.int32()),
    ]), ("o_id",)),
    "items": (pa.schema([
        pa.field("i_order", pa.int64(), nullable=False), pa.field("i_line", pa.int32(), nullable=False),
        pa.field("i_qty", pa.int64()), pa.field("i_price", pa.decimal128(9, 2)),
    ]), ("i_order", "i_line")),
}
SEGMENTS = ("building", "auto", None)
STATUSES = ("o", "f", "p", None)
KEY_SPACE = 12
"""Keys (and foreign keys) are drawn from 0..KEY_SPACE-1, so some references dangle."""


@dataclass
class LiveTable:
    """An upstream table and a model of its rows, keyed by its primary key."""

    name: str
    uri: str
    rows: dict[tuple, dict[str, Any]] = field(default_factory=dict)

    @property
    def schema(self) -> pa.Schema:
        return SCHEMAS[self.name][0]

    @property
    def key(self) -> tuple[str, ...]:
        return SCHEMAS[self.name][1]

    def version(self) -> int:
        return DeltaTable(self.uri).version()

    def commit(self, upserts: list[dict[str, Any]] = (), deletes: list[tuple] = ()) -> int:  # type: ignore[assignment]
        """Upsert and delete rows in one MERGE; the new version (unchanged when nothing to do)."""
        source = []
        for row in upserts:
            key = tuple(row[k] for k in self.key)
            self.rows[key] = dict(row)
            source.append({**row, "_op": "upsert"})
        for key in deletes:
            if key in self.rows:
                source.append({**self.rows.pop(key), "_op": "delete"})
        if not source:
            return self.version()
        merge_schema = self.schema.append(pa.field("_op", pa.string()))
        same_key = " AND ".join(f"t.{k} = s.{k}" for k in self.key)
        columns = {name: f"s.{name}" for name in self.schema.names}
        (
            DeltaTable(self.uri)
            .merge(pa.Table.from_pylist(source, schema=merge_schema), predicate=same_key,
                   source_alias="s", target_alias="t")
            .when_matched_delete(predicate="s._op = 'delete'")
            .when_matched_update(updates=columns, predicate="s._op = 'upsert'")
            .when_not_matched_insert(updates=columns, predicate="s._op = 'upsert'")
            .execute()
        )
        return self.version()


def create(root: str, name: str, rows: list[dict[str, Any]]) -> LiveTable:
    """Version 0 of table `name` under `root` with `rows`, Change Data Feed on."""
    table = LiveTable(name, f"{root}/{name}")
    for row in rows:
        table.rows[tuple(row[k] for k in table.key)] = dict(row)
    write_deltalake(table.uri, pa.Table.from_pylist(rows, schema=table.schema),
                    configuration={"delta.enableChangeDataFeed": "true"})
    return table


def random_row(name: str, rng: random.Random, key: tuple | None = None) -> dict[str, Any]:
    """A row of table `name` (key drawn at random unless given); about a tenth of values NULL."""
    def maybe(value: Any) -> Any:
        return None if rng.random() < 0.1 else value

    ref = lambda: maybe(rng.randrange(KEY_SPACE))  # noqa: E731
    if name == "nation":
        row = {"n_id": rng.randrange(KEY_SPACE), "n_name": maybe(rng.choice("xyz"))}
    elif name == "customer":
        row = {"c_id": rng.randrange(KEY_SPACE), "c_nation": ref(), "c_segment": rng.choice(SEGMENTS),
               "c_name": maybe(f"c{rng.randrange(100)}")}
    elif name == "orders":
        row = {"o_id": rng.randrange(KEY_SPACE), "o_cust": ref(), "o_status": rng.choice(STATUSES),
               "o_day": maybe(rng.randrange(30))}
    else:
        row = {"i_order": rng.randrange(KEY_SPACE), "i_line": rng.randrange(3), "i_qty": maybe(rng.randrange(1, 9)),
               "i_price": maybe(Decimal(rng.randrange(100, 9999)).scaleb(-2))}
    if key is not None:
        row.update(zip(SCHEMAS[name][1], key, strict=True))
    return row


def initial_rows(name: str, rng: random.Random, count: int) -> list[dict[str, Any]]:
    rows: dict[tuple, dict[str, Any]] = {}
    while len(rows) < count:
        row = random_row(name, rng)
        rows[tuple(row[k] for k in SCHEMAS[name][1])] = row
    return list(rows.values())


def random_epoch(table: LiveTable, rng: random.Random, changes: int = 3) -> int:
    """One commit of up to `changes` random inserts, updates (foreign keys included) and deletes."""
    upserts: dict[tuple, dict[str, Any]] = {}
    deletes: list[tuple] = []
    for _ in range(rng.randint(1, changes)):
        live = sorted(set(table.rows) - set(upserts) - set(deletes))
        if live and rng.random() < 0.3:
            deletes.append(rng.choice(live))
            continue
        key = rng.choice(live) if live and rng.random() < 0.5 else None
        row = random_row(table.name, rng, key)
        row_key = tuple(row[k] for k in table.key)
        if row_key not in deletes:
            upserts[row_key] = row
    return table.commit(list(upserts.values()), deletes)


def create_all(root: str, seed: int, names: tuple[str, ...] = ("customer", "orders", "items"),
               sizes: dict[str, int] | None = None) -> dict[str, LiveTable]:
    """The named tables with a few random rows each."""
    rng = random.Random(seed)
    sizes = {"nation": 5, "customer": 8, "orders": 9, "items": 14, **(sizes or {})}
    return {name: create(root, name, initial_rows(name, rng, sizes[name])) for name in names}


def sources(tables: dict[str, LiveTable]) -> dict[str, dict[str, Any]]:
    """The job's `sources` for these tables."""
    return {name: {"table": table.uri, "primary_key": list(table.key)} for name, table in tables.items()}
