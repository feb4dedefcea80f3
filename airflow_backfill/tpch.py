"""TPC-H `orders` and `lineitem` (and `customer`) as live upstream Delta tables, for tests and benchmarks.

The initial load comes from `tpchgen-cli` (the package's `demo` extra, run locally into a
temporary folder: nothing is downloaded) and is written by delta-rs into two
unpartitioned Delta tables with the Change Data Feed on, in one commit each, split into
several files so that the snapshot phase has several files and chunks to work on.

Refreshes then make the tables live, in the spirit of the TPC-H refresh functions:

- RF1 (`insert_new_orders`) inserts new orders with their line items, keys beyond the
  existing range; one commit to `orders`, then one to `lineitem`.
- RF2 (`delete_old_orders`) deletes orders of the initial load with their line items;
  one commit to `lineitem`, then one to `orders` (children first, as in the spec).
- `update_lineitems` changes the discount of a share of the line items in one MERGE,
  which is what the benchmark's catch-up measurements replay: scattered at random, or
  the newest orders' line items (`newest`), changes clustered by key like late updates
  to recent records.

A refresh touches about 0.1% of the orders by default (`REFRESH_SHARE`), as TPC-H does.
Everything is deterministic given a seed and the tables' history: each refresh seeds its
random generator with the seed, the kind of refresh and the table's version.

`customer`, for joins such as TPC-H Q3, is loaded by the `load` command (by default) and by
`load_tpch(tables=LOADABLE)`; the refreshes leave it unchanged, as TPC-H's do.

Primary keys (TPC-H section 1.4): `orders(o_orderkey)`, `lineitem(l_orderkey, l_linenumber)`,
`customer(c_custkey)`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import date, timedelta
from decimal import Decimal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import CommitProperties, DeltaTable, write_deltalake

from airflow_backfill.engine.delta.log import (
    CDF_PROPERTY,
    CHECKPOINT_INTERVAL_PROPERTY,
    UPSTREAM_CHECKPOINT_INTERVAL,
    arrow_schema,
    table_exists,
)
from airflow_backfill.exceptions import BackfillConfigError, UpstreamError

log = logging.getLogger(__name__)

ORDERS = "orders"
LINEITEM = "lineitem"
CUSTOMER = "customer"
TABLES = (ORDERS, LINEITEM)
"""The tables the refreshes change (loaded by default)."""
LOADABLE = (*TABLES, CUSTOMER)
PRIMARY_KEYS: dict[str, tuple[str, ...]] = {
    ORDERS: ("o_orderkey",),
    LINEITEM: ("l_orderkey", "l_linenumber"),
    CUSTOMER: ("c_custkey",),
}
"""The tables' primary keys, as a job's `primary_key` must declare them."""

REFRESH_SHARE = 0.001
"""Share of the orders one RF1 or RF2 inserts or deletes (TPC-H: SF * 1500 of SF * 1.5 M)."""
DEFAULT_FILES = 8
"""Data files per table written by the initial load."""
ORDERS_PER_SF = 1_500_000
METADATA_PREFIX = "tpch."
_DESCRIPTION = "TPC-H {table} at scale factor {scale_factor}"

# Value ranges of TPC-H section 4.2.3, used to make RF1's new rows look like dbgen's.
START_DATE = date(1992, 1, 1)
END_DATE = date(1998, 12, 31)
CURRENT_DATE = date(1995, 6, 17)
_PRIORITIES = ("1-URGENT", "2-HIGH", "3-MEDIUM", "4-NOT SPECIFIED", "5-LOW")
_INSTRUCTIONS = ("DELIVER IN PERSON", "COLLECT COD", "NONE", "TAKE BACK RETURN")
_MODES = ("REG AIR", "AIR", "RAIL", "SHIP", "TRUCK", "MAIL", "FOB")
_WORDS = (
    "furiously", "slyly", "carefully", "blithely", "quickly", "fluffily", "final", "ironic",
    "pending", "regular", "express", "special", "bold", "even", "silent", "unusual",
    "deposits", "requests", "accounts", "packages", "foxes", "ideas", "theodolites",
    "pinto", "beans", "instructions", "dependencies", "courts", "asymptotes", "sleep",
    "wake", "haggle", "nag", "use", "cajole", "boost", "affix", "detect", "integrate",
)


@dataclass(frozen=True)
class TpchTables:
    """Where the two upstream tables live and the scale factor they were loaded at."""

    root: str
    scale_factor: float

    @property
    def orders(self) -> str:
        return os.path.join(self.root, ORDERS)

    @property
    def lineitem(self) -> str:
        return os.path.join(self.root, LINEITEM)

    @property
    def customer(self) -> str:
        return os.path.join(self.root, CUSTOMER)

    def path(self, table: str) -> str:
        return os.path.join(self.root, table)


@dataclass(frozen=True)
class RefreshResult:
    """What one refresh changed: orders and line items, and the versions it committed."""

    kind: str
    orders: int
    lineitems: int
    orders_version: int
    lineitem_version: int
    order_keys: tuple[int, int]
    """The smallest and largest order key the refresh touched."""


# --- initial load -------------------------------------------------------------------------


def tpchgen_executable() -> str:
    """The `tpchgen-cli` of this interpreter's environment (or on PATH)."""
    beside = os.path.join(os.path.dirname(sys.executable), "tpchgen-cli")
    found = beside if os.access(beside, os.X_OK) else shutil.which("tpchgen-cli")
    if not found:
        raise BackfillConfigError(
            "tpchgen-cli is not installed; install the package's demo extra "
            "(pip install 'airflow-backfill[demo]', or scripts/install.sh in a checkout)."
        )
    return found


def generate_parquet(
    scale_factor: float, out_dir: str, *, tables: Sequence[str] = TABLES, parts: int = 1
) -> dict[str, list[str]]:
    """Run tpchgen-cli into `out_dir`; returns each table's Parquet files, in part order."""
    _check_scale_factor(scale_factor)
    unknown = sorted(set(tables) - set(LOADABLE))
    if unknown:
        raise BackfillConfigError(f"unknown TPC-H table(s) {unknown}; choose from {list(LOADABLE)}.")
    command = [
        tpchgen_executable(), "parquet", "--scale-factor", str(scale_factor), "--tables", ",".join(tables),
        "--parts", str(parts), "--output-dir", out_dir, "--quiet", "--no-progress",
    ]
    subprocess.run(command, check=True, capture_output=True, text=True)
    files: dict[str, list[str]] = {}
    for table in tables:
        folder = os.path.join(out_dir, table)
        names = [name for name in os.listdir(folder) if name.endswith(".parquet")]
        files[table] = [os.path.join(folder, name) for name in sorted(names, key=_part_number)]
    return files


def _part_number(name: str) -> int:
    """`lineitem.10.parquet` -> 10, so that parts sort numerically."""
    pieces = name.split(".")
    return int(pieces[1]) if len(pieces) == 3 and pieces[1].isdigit() else 0


def load_tpch(
    root: str, scale_factor: float, *, files: int = DEFAULT_FILES, tables: Sequence[str] = TABLES
) -> TpchTables:
    """Generate TPC-H at `scale_factor` and create `<root>/orders` and `<root>/lineitem`
    (or the `tables` asked for, `customer` among them).

    Each table is created in one commit (version 0) with the Change Data Feed on,
    unpartitioned, in about `files` data files. Existing tables are refused.
    """
    _check_scale_factor(scale_factor)
    if files < 1:
        raise BackfillConfigError(f"files must be 1 or more, got {files}.")
    for table in tables:
        if table_exists(os.path.join(root, table)):
            raise UpstreamError(f"{os.path.join(root, table)} already exists; delete it or choose another root.")
    os.makedirs(root, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tpchgen-", dir=root) as scratch:
        generated = generate_parquet(scale_factor, scratch, tables=tables, parts=files)
        for table in tables:
            _write_table(os.path.join(root, table), table, generated[table], scale_factor, files)
    return TpchTables(root=os.path.abspath(root), scale_factor=scale_factor)


def _write_table(uri: str, table: str, parquet_files: list[str], scale_factor: float, files: int) -> None:
    dataset = ds.dataset(parquet_files, format="parquet")
    schema = delta_compatible_schema(dataset.schema)
    batches = (batch.cast(schema) for batch in dataset.to_batches())
    total_bytes = sum(os.path.getsize(path) for path in parquet_files)
    write_deltalake(
        uri,
        pa.RecordBatchReader.from_batches(schema, batches),
        mode="error",
        name=table,
        description=_DESCRIPTION.format(table=table, scale_factor=scale_factor),
        configuration={CDF_PROPERTY: "true", CHECKPOINT_INTERVAL_PROPERTY: UPSTREAM_CHECKPOINT_INTERVAL},
        target_file_size=max(64 * 1024, total_bytes // files),
        commit_properties=CommitProperties(custom_metadata={
            f"{METADATA_PREFIX}scale_factor": str(scale_factor), f"{METADATA_PREFIX}refresh": "load",
        }),
    )
    log.info("loaded %s at scale factor %s: %s rows", uri, scale_factor, dataset.count_rows())


def delta_compatible_schema(schema: pa.Schema) -> pa.Schema:
    """tpchgen's schema with plain strings (Spark and Delta have no string views) and no field ids."""
    fields = [
        pa.field(f.name, pa.string() if f.type == pa.string_view() else f.type, nullable=f.nullable)
        for f in schema
    ]
    return pa.schema(fields)


def open_tpch(root: str) -> TpchTables:
    """The tables `load_tpch` created under `root`, with their scale factor."""
    uri = os.path.join(root, ORDERS)
    if not table_exists(uri):
        raise UpstreamError(f"{uri} is not a Delta table; load TPC-H there first (python -m airflow_backfill.tpch load).")
    description = DeltaTable(uri).metadata().description or ""
    try:
        scale_factor = float(description.rsplit(" ", 1)[-1])
    except ValueError:
        raise UpstreamError(f"{uri} was not created by airflow_backfill.tpch (description {description!r}).") from None
    return TpchTables(root=os.path.abspath(root), scale_factor=scale_factor)


def _check_scale_factor(scale_factor: float) -> None:
    if not isinstance(scale_factor, int | float) or isinstance(scale_factor, bool) or not 0 < scale_factor <= 1000:
        raise BackfillConfigError(f"scale factor must be a number in (0, 1000], got {scale_factor!r}.")


# --- refreshes ----------------------------------------------------------------------------


def refresh_count(tables: TpchTables, share: float = REFRESH_SHARE) -> int:
    """Orders one refresh touches: `share` of the scale factor's orders, at least one."""
    return max(1, round(tables.scale_factor * ORDERS_PER_SF * share))


def insert_new_orders(tables: TpchTables, seed: int, count: int | None = None) -> RefreshResult:
    """RF1: insert `count` new orders and their 1-7 line items, keys above the existing ones."""
    count = refresh_count(tables) if count is None else _check_count(count)
    orders_table = DeltaTable(tables.orders)
    rng = random.Random(f"{seed}/rf1/{orders_table.version()}")
    first_key = max(_max_value(orders_table, "o_orderkey"), _max_value(DeltaTable(tables.lineitem), "l_orderkey")) + 1
    orders, lineitems = _new_orders(rng, tables.scale_factor, first_key, count)
    properties = _refresh_properties("RF1", seed)
    write_deltalake(tables.orders, orders.cast(arrow_schema(orders_table)), mode="append",
                    commit_properties=properties)
    lineitem_table = DeltaTable(tables.lineitem)
    write_deltalake(tables.lineitem, lineitems.cast(arrow_schema(lineitem_table)), mode="append",
                    commit_properties=properties)
    return RefreshResult(
        kind="RF1", orders=orders.num_rows, lineitems=lineitems.num_rows,
        orders_version=DeltaTable(tables.orders).version(), lineitem_version=DeltaTable(tables.lineitem).version(),
        order_keys=(first_key, first_key + count - 1),
    )


def delete_old_orders(tables: TpchTables, seed: int, count: int | None = None) -> RefreshResult:
    """RF2: delete `count` orders of the initial load (chosen at random) and their line items."""
    count = refresh_count(tables) if count is None else _check_count(count)
    orders_table = DeltaTable(tables.orders)
    rng = random.Random(f"{seed}/rf2/{orders_table.version()}")
    loaded_max = _max_value(DeltaTable(tables.orders, version=0), "o_orderkey")
    present = orders_table.to_pyarrow_table(columns=["o_orderkey"]).column("o_orderkey").to_pylist()
    old = sorted(key for key in present if key <= loaded_max)
    if not old:
        raise UpstreamError(f"{tables.orders} has no orders of the initial load left to delete.")
    keys = sorted(rng.sample(old, min(count, len(old))))
    listed = ", ".join(str(key) for key in keys)
    properties = _refresh_properties("RF2", seed)
    deleted_lines = DeltaTable(tables.lineitem).delete(f"l_orderkey IN ({listed})", commit_properties=properties)
    deleted_orders = orders_table.delete(f"o_orderkey IN ({listed})", commit_properties=properties)
    return RefreshResult(
        kind="RF2", orders=int(deleted_orders.get("num_deleted_rows", 0)),
        lineitems=int(deleted_lines.get("num_deleted_rows", 0)),
        orders_version=DeltaTable(tables.orders).version(), lineitem_version=DeltaTable(tables.lineitem).version(),
        order_keys=(keys[0], keys[-1]),
    )


def update_lineitems(tables: TpchTables, seed: int, share: float, *, newest: bool = False) -> tuple[int, int]:
    """Give `share` of the line items a new discount (never the one they had) in one MERGE
    on the key: rows chosen at random, or with `newest` the rows of the largest order keys.

    Returns (rows updated, the lineitem version committed). Every updated row shows up in
    the change feed as an update pre-image and post-image.
    """
    if not 0 < share <= 1:
        raise BackfillConfigError(f"share must be in (0, 1], got {share}.")
    table = DeltaTable(tables.lineitem)
    rng = random.Random(f"{seed}/update/{table.version()}")
    rows = table.to_pyarrow_table(columns=[*PRIMARY_KEYS[LINEITEM], "l_discount"])
    count = min(max(1, round(rows.num_rows * share)), rows.num_rows)
    if newest:
        chosen = rows.take(pc.sort_indices(rows, sort_keys=[("l_orderkey", "descending")])[:count])
    else:
        chosen = rows.take(sorted(rng.sample(range(rows.num_rows), count)))
    discounts = pa.array([_other_discount(rng, old) for old in chosen.column("l_discount").to_pylist()],
                         pa.decimal128(15, 2))
    source = chosen.drop_columns(["l_discount"]).append_column("l_discount", discounts)
    metrics = (
        table.merge(
            source, predicate="t.l_orderkey = s.l_orderkey AND t.l_linenumber = s.l_linenumber",
            source_alias="s", target_alias="t",
            commit_properties=_refresh_properties("update", seed, share=str(share)),
        )
        .when_matched_update(updates={"l_discount": "s.l_discount"})
        .execute()
    )
    return int(metrics.get("num_target_rows_updated", chosen.num_rows)), DeltaTable(tables.lineitem).version()


def _other_discount(rng: random.Random, old: Decimal) -> Decimal:
    """A discount of 0.00 - 0.10 (TPC-H's range) other than `old`: an update that rewrote
    a row unchanged would change no MV row."""
    cents = rng.randint(0, 9)
    return Decimal(cents if cents < int(old * 100) else cents + 1).scaleb(-2)


def _check_count(count: int) -> int:
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise BackfillConfigError(f"count must be a whole number of orders, 1 or more, got {count!r}.")
    return count


def _refresh_properties(kind: str, seed: int, **extra: str) -> CommitProperties:
    metadata = {"refresh": kind, "seed": str(seed), **extra}
    return CommitProperties(custom_metadata={METADATA_PREFIX + key: value for key, value in metadata.items()})


def _max_value(table: DeltaTable, column: str) -> int:
    """The column's largest value, from the files' statistics (no data read)."""
    actions = pa.table(table.get_add_actions(flatten=True))
    name = f"max.{column}"
    if name not in actions.column_names:
        values = table.to_pyarrow_table(columns=[column]).column(column)
        return int(pc.max(values).as_py() or 0)
    return int(pc.max(actions.column(name)).as_py() or 0)


def _new_orders(rng: random.Random, scale_factor: float, first_key: int, count: int) -> tuple[pa.Table, pa.Table]:
    """`count` orders with keys from `first_key` and their line items, as dbgen shapes them."""
    customers = max(1, round(scale_factor * 150_000))
    parts = max(1, round(scale_factor * 200_000))
    suppliers = max(1, round(scale_factor * 10_000))
    clerks = max(1, round(scale_factor * 1_000))
    order_days = (END_DATE - START_DATE).days - 151
    orders: list[dict] = []
    lines: list[dict] = []
    for order_key in range(first_key, first_key + count):
        order_date = START_DATE + timedelta(days=rng.randint(0, order_days))
        order_lines = [
            _new_lineitem(rng, order_key, number, order_date, parts, suppliers)
            for number in range(1, rng.randint(1, 7) + 1)
        ]
        total = sum(line.pop("_total_cents") for line in order_lines)
        statuses = {line["l_linestatus"] for line in order_lines}
        orders.append({
            "o_orderkey": order_key,
            "o_custkey": rng.randint(1, customers),
            "o_orderstatus": statuses.pop() if len(statuses) == 1 else "P",
            "o_totalprice": Decimal(total).scaleb(-2),
            "o_orderdate": order_date,
            "o_orderpriority": rng.choice(_PRIORITIES),
            "o_clerk": f"Clerk#{rng.randint(1, clerks):09d}",
            "o_shippriority": 0,
            "o_comment": _comment(rng, 19, 78),
        })
        lines.extend(order_lines)
    return pa.Table.from_pylist(orders), pa.Table.from_pylist(lines)


def _new_lineitem(
    rng: random.Random, order_key: int, number: int, order_date: date, parts: int, suppliers: int
) -> dict:
    part_key = rng.randint(1, parts)
    quantity = rng.randint(1, 50)
    retail_cents = 90_000 + ((part_key // 10) % 20_001) + 100 * (part_key % 1_000)
    price_cents = quantity * retail_cents
    discount, tax = rng.randint(0, 10), rng.randint(0, 8)
    ship_date = order_date + timedelta(days=rng.randint(1, 121))
    receipt_date = ship_date + timedelta(days=rng.randint(1, 30))
    return {
        "l_orderkey": order_key,
        "l_partkey": part_key,
        "l_suppkey": rng.randint(1, suppliers),
        "l_linenumber": number,
        "l_quantity": Decimal(quantity * 100).scaleb(-2),
        "l_extendedprice": Decimal(price_cents).scaleb(-2),
        "l_discount": Decimal(discount).scaleb(-2),
        "l_tax": Decimal(tax).scaleb(-2),
        "l_returnflag": rng.choice("RA") if receipt_date <= CURRENT_DATE else "N",
        "l_linestatus": "O" if ship_date > CURRENT_DATE else "F",
        "l_shipdate": ship_date,
        "l_commitdate": order_date + timedelta(days=rng.randint(30, 90)),
        "l_receiptdate": receipt_date,
        "l_shipinstruct": rng.choice(_INSTRUCTIONS),
        "l_shipmode": rng.choice(_MODES),
        "l_comment": _comment(rng, 10, 43),
        "_total_cents": round(price_cents * (100 + tax) * (100 - discount) / 10_000),
    }


def _comment(rng: random.Random, shortest: int, longest: int) -> str:
    length = rng.randint(shortest, longest)
    text = ""
    while len(text) < length:
        text = f"{text} {rng.choice(_WORDS)}" if text else rng.choice(_WORDS)
    return text[:length]


# --- command line -------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m airflow_backfill.tpch",
        description="Create TPC-H orders/lineitem/customer upstream Delta tables and run refreshes on them.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    load = commands.add_parser("load", help="generate TPC-H with tpchgen-cli and create the Delta tables")
    load.add_argument("--root", required=True, help="folder that receives orders/, lineitem/ and customer/")
    load.add_argument("--scale-factor", type=float, default=0.01)
    load.add_argument("--files", type=int, default=DEFAULT_FILES, help="data files per table")
    load.add_argument("--tables", default=",".join(LOADABLE),
                      help=f"comma-separated tables to load, of {', '.join(LOADABLE)} (default: all)")
    for name, text in (("rf1", "insert new orders and their line items"),
                       ("rf2", "delete old orders and their line items")):
        command = commands.add_parser(name, help=text)
        command.add_argument("--root", required=True)
        command.add_argument("--seed", type=int, default=1)
        command.add_argument("--count", type=int, default=None, help="orders (default: 0.1%% of the scale factor's)")
        command.add_argument("--repeat", type=int, default=1, help="refreshes to run, one after the other")
    update = commands.add_parser("update", help="update the discount of a share of the line items")
    update.add_argument("--root", required=True)
    update.add_argument("--seed", type=int, default=1)
    update.add_argument("--share", type=float, default=0.01)
    update.add_argument("--newest", action="store_true", help="the newest orders' line items instead of random ones")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        if args.command == "load":
            tables = load_tpch(args.root, args.scale_factor, files=args.files,
                               tables=[name.strip() for name in args.tables.split(",") if name.strip()])
            print(json.dumps(asdict(tables)))
        elif args.command in ("rf1", "rf2"):
            tables = open_tpch(args.root)
            refresh = insert_new_orders if args.command == "rf1" else delete_old_orders
            for _ in range(args.repeat):
                print(json.dumps(asdict(refresh(tables, args.seed, args.count))))
        else:
            rows, version = update_lineitems(open_tpch(args.root), args.seed, args.share, newest=args.newest)
            print(json.dumps({"updated": rows, "lineitem_version": version}))
    except (BackfillConfigError, UpstreamError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
