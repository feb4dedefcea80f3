"""The upstream simulator: a live `orders` Delta table for the demo, tests and benchmarks.

The table has the Change Data Feed on. Each epoch is exactly one Delta version, written
by one MERGE that inserts new orders, updates existing ones (status changes, including
to 'cancelled' and back, and NULL amounts) and deletes some, so the feed carries
`insert`, `update_preimage`, `update_postimage` and `delete` rows.

Everything is deterministic given a seed: the same seed and the same history give the
same rows, because timestamps come from a logical clock (the epoch number), not the wall
clock.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError

from airflow_backfill.engine.delta.log import (
    CDF_PROPERTY,
    CHECKPOINT_INTERVAL_PROPERTY,
    UPSTREAM_CHECKPOINT_INTERVAL,
    delta_table,
    table_exists,
)
from airflow_backfill.exceptions import BackfillConfigError, UpstreamError
from airflow_backfill.storage.s3_settings import storage_options

log = logging.getLogger(__name__)

STATUSES = ("new", "paid", "shipped", "cancelled")
ORDERS_SCHEMA = pa.schema([
    pa.field("order_id", pa.int64(), nullable=False),
    pa.field("customer_id", pa.int64()),
    pa.field("status", pa.string()),
    pa.field("amount", pa.float64()),
    pa.field("quantity", pa.int32()),
    pa.field("updated_at", pa.timestamp("us", tz="UTC")),
])
_COLUMNS = ORDERS_SCHEMA.names
_OP = "_simulator_op"
_MERGE_SCHEMA = ORDERS_SCHEMA.append(pa.field(_OP, pa.string(), nullable=False))

CLOCK_START = datetime(2024, 1, 1, tzinfo=UTC)
"""The logical clock's origin: row `i` of the initial load and epoch `v` get fixed times."""
NULL_AMOUNT_SHARE = 0.05
CANCEL_SHARE = 0.15
UNCANCEL_SHARE = 0.6
MAX_COMMIT_ATTEMPTS = 20


@dataclass(frozen=True)
class EpochCounts:
    """What one epoch changed (after capping to the rows that exist)."""

    version: int
    inserts: int
    updates: int
    deletes: int


def _customers(rows: int) -> int:
    return max(10, rows // 10)


def _amount(rng: random.Random) -> float | None:
    if rng.random() < NULL_AMOUNT_SHARE:
        return None
    return round(rng.uniform(1.0, 500.0), 2)


def _new_order(rng: random.Random, order_id: int, customers: int, updated_at: datetime) -> dict:
    return {
        "order_id": order_id,
        "customer_id": rng.randint(1, customers),
        "status": rng.choices(STATUSES, weights=(50, 30, 15, 5))[0],
        "amount": _amount(rng),
        "quantity": rng.randint(1, 10),
        "updated_at": updated_at,
    }


def _next_status(rng: random.Random, status: str | None) -> str:
    """A plausible status change; cancelled orders are sometimes reinstated."""
    if status == "cancelled":
        return rng.choice(("new", "paid")) if rng.random() < UNCANCEL_SHARE else "cancelled"
    if rng.random() < CANCEL_SHARE:
        return "cancelled"
    progression = {"new": "paid", "paid": "shipped", "shipped": "shipped"}
    return progression.get(status or "new", "new")


def create_orders_table(uri: str, rows: int, seed: int, *, reuse: bool = False) -> int:
    """Create the `orders` upstream with `rows` orders (keys 1..rows) in version 0.

    Refuses an existing table unless `reuse` is set; a reused table must have the Change
    Data Feed on. Returns the table's version.
    """
    if rows < 0:
        raise BackfillConfigError(f"rows must be zero or more, got {rows}.")
    if table_exists(uri):
        if not reuse:
            raise UpstreamError(
                f"upstream {uri} already exists; pass reuse=True to keep committing to it "
                "or delete the folder to start over."
            )
        table = delta_table(uri)
        if str(table.metadata().configuration.get(CDF_PROPERTY, "false")).lower() != "true":
            raise UpstreamError(f"upstream {uri} exists but does not have the Change Data Feed on.")
        return table.version()
    rng = random.Random(seed)
    customers = _customers(rows)
    orders = [
        _new_order(rng, order_id, customers, CLOCK_START + timedelta(milliseconds=order_id))
        for order_id in range(1, rows + 1)
    ]
    write_deltalake(
        uri,
        pa.Table.from_pylist(orders, schema=ORDERS_SCHEMA),
        mode="error",
        name="orders",
        configuration={CDF_PROPERTY: "true", CHECKPOINT_INTERVAL_PROPERTY: UPSTREAM_CHECKPOINT_INTERVAL},
        commit_properties=CommitProperties(custom_metadata={"simulator.rows": str(rows)}),
        storage_options=storage_options(uri),
    )
    version = delta_table(uri).version()
    log.info("created upstream %s with %s orders at version %s (seed %s)", uri, rows, version, seed)
    return version


def _plan_epoch(table: DeltaTable, rng: random.Random, inserts: int, updates: int, deletes: int) -> pa.Table:
    """The epoch's changes as one MERGE source: every order row plus the operation to apply."""
    current = table.to_pyarrow_table(columns=["order_id", "status"])
    current = current.sort_by("order_id")
    keys = current.column("order_id").to_pylist()
    statuses = dict(zip(keys, current.column("status").to_pylist(), strict=True))
    customers = _customers(len(keys))
    updated_at = CLOCK_START + timedelta(days=1, seconds=table.version() + 1)
    next_key = (keys[-1] if keys else 0) + 1

    # The largest key is never deleted, so `max + 1` never hands out a key used before.
    deletable = keys[:-1]
    deletes = min(deletes, len(deletable))
    deleted = rng.sample(deletable, deletes)
    remaining = sorted(set(keys) - set(deleted))
    updated = rng.sample(remaining, min(updates, len(remaining)))

    rows = [{**_new_order(rng, next_key + i, customers, updated_at), _OP: "insert"} for i in range(inserts)]
    for order_id in updated:
        rows.append({
            "order_id": order_id,
            "customer_id": None,
            "status": _next_status(rng, statuses[order_id]),
            "amount": _amount(rng),
            "quantity": rng.randint(1, 10),
            "updated_at": updated_at,
            _OP: "update",
        })
    rows.extend({**dict.fromkeys(_COLUMNS), "order_id": order_id, _OP: "delete"} for order_id in deleted)
    return pa.Table.from_pylist(rows, schema=_MERGE_SCHEMA)


def _merge(table: DeltaTable, changes: pa.Table) -> None:
    counts = pc.value_counts(changes.column(_OP)).to_pylist()
    metadata = {f"simulator.{item['values']}s": str(item["counts"]) for item in counts}
    (
        table.merge(
            changes,
            predicate="t.order_id = s.order_id",
            source_alias="s",
            target_alias="t",
            commit_properties=CommitProperties(custom_metadata=metadata),
        )
        .when_matched_delete(predicate=f"s.{_OP} = 'delete'")
        .when_matched_update(
            updates={column: f"s.{column}" for column in _COLUMNS if column not in ("order_id", "customer_id")},
            predicate=f"s.{_OP} = 'update'",
        )
        .when_not_matched_insert(
            updates={column: f"s.{column}" for column in _COLUMNS},
            predicate=f"s.{_OP} = 'insert'",
        )
        .execute()
    )


def commit_epoch(uri: str, rng: random.Random, inserts: int, updates: int, deletes: int) -> int:
    """Commit exactly one upstream version mixing inserts, updates and deletes.

    Updates and deletes are capped to the orders that exist. A commit that loses a race
    with another writer is planned again on the newer version and retried. Returns the
    new version.
    """
    return commit_epoch_counts(uri, rng, inserts, updates, deletes).version


def commit_epoch_counts(uri: str, rng: random.Random, inserts: int, updates: int, deletes: int) -> EpochCounts:
    """`commit_epoch`, also returning how many rows of each kind the epoch changed."""
    _check_counts(inserts, updates, deletes)
    for attempt in range(1, MAX_COMMIT_ATTEMPTS + 1):
        table = delta_table(uri)
        changes = _plan_epoch(table, rng, inserts, updates, deletes)
        try:
            _merge(table, changes)
        except CommitFailedError as error:  # another writer committed first
            if attempt == MAX_COMMIT_ATTEMPTS:
                raise
            log.warning("epoch commit conflicted with another writer (attempt %s): %s; retrying", attempt, error)
            time.sleep(min(0.05 * attempt, 1.0))
            continue
        ops = changes.column(_OP)
        return EpochCounts(
            version=table.version(),
            inserts=pc.sum(pc.equal(ops, "insert")).as_py() or 0,
            updates=pc.sum(pc.equal(ops, "update")).as_py() or 0,
            deletes=pc.sum(pc.equal(ops, "delete")).as_py() or 0,
        )
    raise AssertionError("unreachable")


def _check_counts(inserts: int, updates: int, deletes: int) -> None:
    for name, value in (("inserts", inserts), ("updates", updates), ("deletes", deletes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise BackfillConfigError(f"{name} must be a whole number of rows, zero or more, got {value!r}.")
    if inserts + updates + deletes == 0:
        raise BackfillConfigError("an epoch needs at least one insert, update or delete; raise one of them.")


def run_simulator(
    uri: str,
    *,
    rows: int,
    epoch_interval: float,
    inserts: int,
    updates: int,
    deletes: int,
    seed: int,
    max_epochs: int | None = None,
    stop_event: threading.Event | None = None,
) -> int:
    """Create the upstream if missing, then commit one epoch every `epoch_interval` seconds.

    Runs until `max_epochs` epochs are committed or `stop_event` is set; a stop request
    never interrupts a commit. Returns the number of epochs committed.
    """
    _check_counts(inserts, updates, deletes)
    if epoch_interval < 0:
        raise BackfillConfigError(f"epoch_interval must be zero or more seconds, got {epoch_interval}.")
    if max_epochs is not None and max_epochs < 0:
        raise BackfillConfigError(f"max_epochs must be zero or more, got {max_epochs}.")
    stop = stop_event or threading.Event()
    create_orders_table(uri, rows, seed, reuse=True)
    rng = random.Random(f"{seed}/epochs")
    committed = 0
    while max_epochs is None or committed < max_epochs:
        if stop.wait(epoch_interval):
            break
        counts = commit_epoch_counts(uri, rng, inserts, updates, deletes)
        committed += 1
        log.info(
            "epoch %s: version %s (%s inserts, %s updates, %s deletes)",
            committed, counts.version, counts.inserts, counts.updates, counts.deletes,
        )
    log.info("simulator stopped after %s epochs", committed)
    return committed
