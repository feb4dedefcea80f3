"""The four upstreams of the users' workload: their schemas, keys and rows.

Users' tables are not the simulator's `orders`: one has a string key, one a key of two
columns, and their columns carry timestamps, decimals, doubles, small integers, booleans,
strings and NULLs. Each row is named by an *index* (0, 1, 2, ...) that maps one to one
onto its primary key, so a writer can keep its keys as a counter and a set of deleted
indices instead of a copy of the table, and a key read back from the table names its
index again. Rows are generated with Arrow from a seeded numpy generator: the same seed
gives the same rows, at any size.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa

DELTA_RS, SPARK = "delta-rs", "spark"
"""Which engine commits to an upstream."""
CLOCK_START = datetime(2024, 1, 1, tzinfo=UTC)
_EPOCH_US = int(CLOCK_START.timestamp() * 1_000_000)
_CODE_MULTIPLIER, _CODE_MODULUS = 61_728_397, 10**8
"""Customer codes are index * 61728397 mod 10^8, zero-padded: unique, and not in index order
(a string key whose new values land among the old ones, as real codes do)."""
_CODE_INVERSE = pow(_CODE_MULTIPLIER, -1, _CODE_MODULUS)
LINES_PER_ORDER = 4
UTC_TIMESTAMP = pa.timestamp("us", tz="UTC")
MONEY = pa.decimal128(12, 2)

ORDER_STATUSES = ("new", "paid", "shipped", "delivered", "cancelled")
REGIONS = ("emea-north", "emea-south", "amer-east", "amer-west", "apac", "latam", "africa", "oceania")
SEGMENTS = ("retail", "smb", "enterprise", "public", "partner")
METHODS = ("card", "bank", "wallet", "voucher")
NOTES = ("leave at door", "gift wrap", "call first", "fragile")


@dataclass(frozen=True)
class UserTable:
    """One upstream: its name, key, schema, the engine that writes it, how an index
    becomes its key (and back), how rows are generated, and the SQL its in-place updates
    set (valid in Spark SQL and in delta-rs' DataFusion)."""

    name: str
    key: tuple[str, ...]
    schema: pa.Schema
    writer: str
    rows: Callable[[np.ndarray, np.random.Generator, int], pa.Table]
    """(indices, generator, population: the initial row count, for foreign keys) -> rows."""
    updates: dict[str, str]
    share: float
    """Its part of the commits over all four upstreams."""

    def keys_of(self, indices: Sequence[int]) -> list[tuple]:
        return [_KEYS[self.name](int(index)) for index in indices]

    def index_of(self, key: tuple) -> int:
        return _INDICES[self.name](key)

    def predicate(self, indices: Sequence[int]) -> str:
        """A SQL predicate that holds for exactly the rows of `indices`."""
        keys = self.keys_of(indices)
        if self.name == "line_items":  # (order_id, line_no) as one number: line_no < 8
            orders = sorted({order for order, _ in keys})
            combined = sorted(order * 8 + line for order, line in keys)
            return f"order_id IN ({_literals(orders)}) AND order_id * 8 + line_no IN ({_literals(combined)})"
        return f"{self.key[0]} IN ({_literals(sorted(key[0] for key in keys))})"


def _literals(values: Sequence[object]) -> str:
    return ", ".join(f"'{value}'" if isinstance(value, str) else str(value) for value in values)


def customer_code(index: int) -> str:
    return f"C{(index * _CODE_MULTIPLIER) % _CODE_MODULUS:08d}"


def customer_index(code: str) -> int:
    return (int(code[1:]) * _CODE_INVERSE) % _CODE_MODULUS


_KEYS: dict[str, Callable[[int], tuple]] = {
    "orders": lambda index: (index + 1,),
    "customers": lambda index: (customer_code(index),),
    "line_items": lambda index: (index // LINES_PER_ORDER + 1, index % LINES_PER_ORDER + 1),
    "payments": lambda index: (index + 1,),
}
_INDICES: dict[str, Callable[[tuple], int]] = {
    "orders": lambda key: int(key[0]) - 1,
    "customers": lambda key: customer_index(str(key[0])),
    "line_items": lambda key: (int(key[0]) - 1) * LINES_PER_ORDER + int(key[1]) - 1,
    "payments": lambda key: int(key[0]) - 1,
}


# ---- column builders ------------------------------------------------------------------


def money(cents: np.ndarray) -> pa.Array:
    """DECIMAL(12, 2) from whole cents, built from its 128-bit buffer (no Python objects)."""
    cents = np.asarray(cents, dtype=np.int64)
    words = np.empty((len(cents), 2), dtype=np.int64)
    words[:, 0], words[:, 1] = cents, np.where(cents < 0, -1, 0)
    return pa.Array.from_buffers(MONEY, len(cents), [None, pa.py_buffer(words.tobytes())])


def instants(microseconds: np.ndarray, nulls: np.ndarray | None = None) -> pa.Array:
    """UTC instants, microseconds after the clock's start."""
    return pa.array(_EPOCH_US + np.asarray(microseconds, dtype=np.int64), UTC_TIMESTAMP, mask=nulls)


def picked(options: Sequence[str], gen: np.random.Generator, n: int, weights: Sequence[float] | None = None,
           nulls: np.ndarray | None = None) -> pa.Array:
    p = None if weights is None else np.asarray(weights, dtype=float) / sum(weights)
    chosen = gen.choice(len(options), size=n, p=p)
    return strings(np.asarray(options, dtype=object)[chosen], nulls)


def strings(values: Sequence[str] | np.ndarray, nulls: np.ndarray | None = None) -> pa.Array:
    return pa.array(np.asarray(values, dtype=object), pa.string(), mask=nulls)


def doubles(values: np.ndarray, nulls: np.ndarray | None = None) -> pa.Array:
    return pa.array(np.round(values, 4), pa.float64(), mask=nulls)


def codes(indices: np.ndarray) -> pa.Array:
    return strings([customer_code(int(index)) for index in indices])


# ---- the four tables' rows -------------------------------------------------------------


def _orders(indices: np.ndarray, gen: np.random.Generator, population: int) -> pa.Table:
    n = len(indices)
    return pa.Table.from_arrays([
        pa.array(indices + 1, pa.int64()),
        codes(gen.integers(0, max(1, population), n)),
        picked(ORDER_STATUSES, gen, n, (30, 25, 20, 15, 10)),
        money(gen.integers(100, 100_000, n)),
        doubles(gen.random(n) * 0.3, nulls=gen.random(n) < 0.1),
        pa.array(gen.integers(1, 6, n), pa.int16()),
        pa.array(gen.random(n) < 0.2, pa.bool_()),
        instants(indices * 37_000_000 + gen.integers(0, 1_000_000, n)),
        picked(NOTES, gen, n, nulls=gen.random(n) < 0.7),
    ], schema=ORDERS)


def _customers(indices: np.ndarray, gen: np.random.Generator, population: int) -> pa.Table:
    n = len(indices)
    return pa.Table.from_arrays([
        codes(indices),
        strings([f"Customer {int(index)}" for index in indices]),
        picked(REGIONS, gen, n),
        picked(SEGMENTS, gen, n, (40, 30, 10, 10, 10)),
        money(gen.integers(0, 2_000_000, n)),
        doubles(gen.random(n), nulls=gen.random(n) < 0.05),
        pa.array(gen.integers(1, 5, n), pa.int16()),
        pa.array(gen.random(n) < 0.85, pa.bool_()),
        instants(gen.integers(0, 3 * 365 * 86_400, n) * 1_000_000),
        strings([f"{customer_code(int(index)).lower()}@example.com" for index in indices], gen.random(n) < 0.3),
    ], schema=CUSTOMERS)


def _line_items(indices: np.ndarray, gen: np.random.Generator, population: int) -> pa.Table:
    n = len(indices)
    skus = max(10, population // 20)
    unshipped = gen.random(n) < 0.4
    return pa.Table.from_arrays([
        pa.array(indices // LINES_PER_ORDER + 1, pa.int64()),
        pa.array(indices % LINES_PER_ORDER + 1, pa.int16()),
        strings([f"SKU-{int(sku)}" for sku in gen.integers(0, skus, n)]),
        pa.array(gen.integers(1, 21, n), pa.int16()),
        money(gen.integers(50, 50_000, n)),
        doubles(gen.random(n) * 0.25),
        pa.array(gen.random(n) < 0.08, pa.bool_()),
        instants(indices * 9_000_000 + gen.integers(0, 86_400_000_000, n), nulls=unshipped),
    ], schema=LINE_ITEMS)


def _payments(indices: np.ndarray, gen: np.random.Generator, population: int) -> pa.Table:
    n = len(indices)
    customers = gen.integers(0, max(1, population), n)
    return pa.Table.from_arrays([
        pa.array(indices + 1, pa.int64()),
        pa.array(gen.integers(1, max(2, population + 1), n), pa.int64()),
        codes(customers),
        picked(METHODS, gen, n, (50, 25, 20, 5)),
        money(gen.integers(100, 120_000, n)),
        doubles(gen.random(n) * 3.0),
        pa.array(gen.integers(1, 4, n), pa.int16()),
        pa.array(gen.random(n) < 0.9, pa.bool_()),
        instants(indices * 23_000_000 + gen.integers(0, 1_000_000, n)),
        strings([f"ref-{int(index)}" for index in indices], gen.random(n) < 0.5),
    ], schema=PAYMENTS)


def _field(name: str, kind: pa.DataType, nullable: bool = True) -> pa.Field:
    return pa.field(name, kind, nullable=nullable)


ORDERS = pa.schema([
    _field("order_id", pa.int64(), False), _field("customer_code", pa.string()), _field("status", pa.string()),
    _field("amount", MONEY), _field("discount", pa.float64()), _field("priority", pa.int16()),
    _field("is_gift", pa.bool_()), _field("ordered_at", UTC_TIMESTAMP), _field("note", pa.string()),
])
CUSTOMERS = pa.schema([
    _field("customer_code", pa.string(), False), _field("name", pa.string()), _field("region", pa.string()),
    _field("segment", pa.string()), _field("credit_limit", MONEY), _field("score", pa.float64()),
    _field("tier", pa.int16()), _field("active", pa.bool_()), _field("signed_up_at", UTC_TIMESTAMP),
    _field("email", pa.string()),
])
LINE_ITEMS = pa.schema([
    _field("order_id", pa.int64(), False), _field("line_no", pa.int16(), False), _field("sku", pa.string()),
    _field("quantity", pa.int16()), _field("unit_price", MONEY), _field("discount", pa.float64()),
    _field("returned", pa.bool_()), _field("shipped_at", UTC_TIMESTAMP),
])
PAYMENTS = pa.schema([
    _field("payment_id", pa.int64(), False), _field("order_id", pa.int64()), _field("customer_code", pa.string()),
    _field("method", pa.string()), _field("amount", MONEY), _field("fee", pa.float64()),
    _field("attempts", pa.int16()), _field("settled", pa.bool_()), _field("paid_at", UTC_TIMESTAMP),
    _field("reference", pa.string()),
])

TABLES: dict[str, UserTable] = {table.name: table for table in (
    UserTable("orders", ("order_id",), ORDERS, DELTA_RS, _orders, {
        "status": ("CASE WHEN status = 'new' THEN 'paid' WHEN status = 'paid' THEN 'shipped' "
                   "WHEN status = 'shipped' THEN 'delivered' WHEN status = 'delivered' THEN 'cancelled' "
                   "ELSE 'new' END"),
        "amount": "amount + CAST(1.25 AS DECIMAL(12,2))",
        "discount": "CASE WHEN discount IS NULL THEN 0.05 ELSE NULL END",
        "is_gift": "NOT is_gift",
    }, 0.30),
    UserTable("customers", ("customer_code",), CUSTOMERS, DELTA_RS, _customers, {
        "score": "COALESCE(score, 0.5) * 0.9 + 0.05",
        "tier": "CAST(tier % 4 + 1 AS SMALLINT)",
        "active": "NOT active",
        "email": "CASE WHEN email IS NULL THEN CONCAT(customer_code, '@example.org') ELSE NULL END",
    }, 0.20),
    UserTable("line_items", ("order_id", "line_no"), LINE_ITEMS, DELTA_RS, _line_items, {
        "quantity": "CAST(quantity % 20 + 1 AS SMALLINT)",
        "discount": "discount / 2",
        "returned": "NOT returned",
        "shipped_at": "CASE WHEN shipped_at IS NULL THEN CAST('2024-06-01T12:00:00Z' AS TIMESTAMP) ELSE NULL END",
    }, 0.35),
    UserTable("payments", ("payment_id",), PAYMENTS, SPARK, _payments, {
        "attempts": "CAST(attempts % 5 + 1 AS SMALLINT)",
        "settled": "NOT settled",
        "fee": "fee + 0.25",
        "reference": "CASE WHEN reference IS NULL THEN CONCAT('retry-', CAST(payment_id AS STRING)) ELSE NULL END",
    }, 0.15),
)}
"""The four upstreams, by name: three written by delta-rs, `payments` by Spark. Spark's
share is the smallest: a Spark commit takes seconds of a core (a user's Spark writer has a
cluster of its own; here it shares the machine with the forward)."""
