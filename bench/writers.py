"""Users' writers: four keyed upstreams, created and then changed as users' services change them.

    python -m bench.writers create --lake DIR --rows 200000 [--seed 1]
    python -m bench.writers run --lake DIR --engine delta-rs [--commits-per-second 2] [--seed 1]
    python -m bench.writers run --lake DIR --engine spark [--commits-per-second 2] [--seed 1]

`orders` (key `order_id BIGINT`), `customers` (`customer_code STRING`) and `line_items`
(`(order_id BIGINT, line_no SMALLINT)`) are written by delta-rs, `payments`
(`payment_id BIGINT`) by Spark with deletion vectors, each engine from a process of its
own (`run --engine`). Every commit is one of the kinds of `commit_mix` (appends, updates,
deletes, re-inserts of deleted keys, upserts), 1 - 500 rows, and is retried when another
writer committed first. `--commits-per-second` is the rate over all four upstreams, each
taking its share (`UserTable.share`: orders 30 %, customers 20 %, line items 35 %,
payments 15 %), each interval drawn between a quarter and 1.75 times its mean. The same seed gives the same commits. Each commit is one JSON line
on stdout (table, kind, rows, version, when, how long, attempts), which the benchmark
reads back.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from bench import delta_rs_writer, spark_writer
from bench.commit_mix import APPEND, REINSERT, UPSERT, CommitPlan, KeyBook, plan_commit
from bench.user_tables import DELTA_RS, SPARK, TABLES, UserTable

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

COMMITS_PER_SECOND = 2.0
MAX_ATTEMPTS = 20
JITTER = (0.25, 1.75)
"""Each interval between an upstream's commits is its mean times a draw from this range."""
KIND_FIELD = "bench.commit_kind"
"""The commit's kind, in delta-rs' commit metadata and in Spark's `userMetadata`."""


def upstream_uri(lake: str | Path, name: str) -> str:
    return str(Path(lake) / name)


# ---- creating the upstreams ------------------------------------------------------------


def initial_rows(table: UserTable, rows: int, seed: int) -> pa.Table:
    generator = np.random.default_rng([seed, list(TABLES).index(table.name)])
    return table.rows(np.arange(rows, dtype=np.int64), generator, rows)


def create_upstreams(lake: str | Path, rows: int, seed: int, spark: SparkSession | None = None) -> dict[str, str]:
    """The four upstreams at version 0, each with `rows` rows; the Spark-written one by
    Spark (`spark`, or a session of its own). Returns their URIs by name."""
    uris = {}
    for table in TABLES.values():
        uri = uris[table.name] = upstream_uri(lake, table.name)
        data, metadata = initial_rows(table, rows, seed), {KIND_FIELD: "initial load", "bench.rows": str(rows)}
        if table.writer == DELTA_RS:
            delta_rs_writer.create(uri, data, metadata)
        else:
            session = spark or spark_writer.writer_session("bench-writers-create")
            spark_writer.create(session, uri, data, metadata)
            if spark is None:
                session.stop()
        log.info("created %s with %s rows", uri, rows)
    return uris


# ---- one commit ---------------------------------------------------------------------------


def held_keys(table: UserTable, uri: str) -> list[tuple]:
    """The table's keys now, read by delta-rs (deletion vectors applied)."""
    from deltalake import DeltaTable, QueryBuilder

    columns = ", ".join(table.key)
    read = QueryBuilder().register("t", DeltaTable(uri)).execute(f"SELECT {columns} FROM t").read_all()
    keys = pa.table(read)
    return list(zip(*(keys.column(name).to_pylist() for name in table.key), strict=True))


def latest_version(uri: str) -> int:
    """The newest version in the table's log (one listing; nothing else writes it)."""
    return max(int(path.stem) for path in (Path(uri) / "_delta_log").glob("*.json") if path.stem.isdigit())


Commit = Callable[[UserTable, str, CommitPlan, pa.Table, dict[str, str]], None]


@dataclass(frozen=True)
class Engine:
    """How one engine commits, and the exceptions that mean another writer won a race."""

    name: str
    commit: Commit
    conflicts: tuple[type[BaseException], ...]


def delta_rs_engine() -> Engine:
    from deltalake.exceptions import CommitFailedError

    return Engine(DELTA_RS, delta_rs_writer.commit, (CommitFailedError,))


def spark_engine(spark: SparkSession) -> Engine:
    from delta.exceptions import DeltaConcurrentModificationException

    def commit(table: UserTable, uri: str, plan: CommitPlan, rows: pa.Table, metadata: dict[str, str]) -> None:
        spark_writer.commit(spark, table, uri, plan, rows, metadata)

    return Engine(SPARK, commit, (DeltaConcurrentModificationException,))


@dataclass
class Upstream:
    """One upstream a writer keeps changing: its keys and its seeded random source."""

    table: UserTable
    uri: str
    book: KeyBook
    rng: random.Random
    """The commits' plans and rows."""
    pace: random.Random
    """The intervals between commits (apart, so the commits do not depend on the pace)."""
    population: int
    due: float = 0.0
    commits: int = field(default=0)

    @classmethod
    def open(cls, table: UserTable, uri: str, seed: int) -> Upstream:
        """The upstream as it is now: its keys read back, its random sources seeded by the
        seed, the table and its version (a restarted writer does not replay old commits)."""
        book = KeyBook.from_indices([table.index_of(key) for key in held_keys(table, uri)])
        seeded = f"{seed}/{table.name}/{latest_version(uri)}"
        return cls(table, uri, book, random.Random(seeded), random.Random(f"{seeded}/pace"), book.next_index)

    def rows_for(self, plan: CommitPlan) -> pa.Table:
        """New images of the rows the plan writes: inserted keys, and an upsert's updated keys."""
        indices = list(plan.inserted) + (list(plan.updated) if plan.kind == UPSERT else [])
        generator = np.random.default_rng(self.rng.getrandbits(64))
        return self.table.rows(np.asarray(indices, dtype=np.int64), generator, self.population)


def commit_next(upstream: Upstream, engine: Engine) -> dict[str, Any]:
    """Plan and make the upstream's next commit, retried on conflict; its record."""
    plan = plan_commit(upstream.rng, upstream.book)
    rows = upstream.rows_for(plan) if plan.kind in (APPEND, REINSERT, UPSERT) else upstream.table.schema.empty_table()
    metadata = {KIND_FIELD: plan.kind, "bench.rows": str(plan.rows)}
    started = time.time()
    for attempt in range(1, MAX_ATTEMPTS + 1):
        try:
            engine.commit(upstream.table, upstream.uri, plan, rows, metadata)
            break
        except engine.conflicts as error:
            if attempt == MAX_ATTEMPTS:
                raise
            log.warning("%s: commit conflicted (attempt %s): %s; retrying", upstream.table.name, attempt, error)
            time.sleep(min(0.05 * attempt, 1.0))
    upstream.book.apply(plan)
    upstream.commits += 1
    return {"table": upstream.table.name, "engine": engine.name, "kind": plan.kind, "rows": plan.rows,
            "inserted": len(plan.inserted), "updated": len(plan.updated), "deleted": len(plan.deleted),
            "version": latest_version(upstream.uri), "at": round(time.time(), 3),
            "seconds": round(time.time() - started, 3), "attempts": attempt}


# ---- the pace ----------------------------------------------------------------------------


def mean_interval(table: UserTable, commits_per_second: float) -> float:
    """Seconds between one upstream's commits: its share of `commits_per_second`."""
    return 1.0 / (commits_per_second * table.share)


def run_writer(upstreams: Sequence[Upstream], engine: Engine, commits_per_second: float, *,
               max_commits: int | None = None, stop: threading.Event | None = None,
               out: IO[str] | None = None) -> list[dict[str, Any]]:
    """Commit to `upstreams` at their pace until `stop` is set or each made `max_commits`.

    Each upstream's next commit is due a jittered interval after the previous one was due;
    one that fell behind commits at once, but never owes more than one interval."""
    stop = stop or threading.Event()
    now = time.monotonic()
    for upstream in upstreams:
        upstream.due = now + upstream.pace.uniform(0.0, mean_interval(upstream.table, commits_per_second))
    records = []
    while not stop.is_set():
        waiting = [u for u in upstreams if max_commits is None or u.commits < max_commits]
        if not waiting:
            break
        upstream = min(waiting, key=lambda u: u.due)
        if stop.wait(max(0.0, upstream.due - time.monotonic())):
            break
        record = commit_next(upstream, engine)
        records.append(record)
        if out is not None:
            out.write(json.dumps(record) + "\n")
            out.flush()
        mean = mean_interval(upstream.table, commits_per_second)
        upstream.due = max(upstream.due + mean * upstream.pace.uniform(*JITTER), time.monotonic() - mean)
    return records


def open_upstreams(lake: str | Path, engine_name: str, seed: int) -> list[Upstream]:
    return [Upstream.open(table, upstream_uri(lake, table.name), seed)
            for table in TABLES.values() if table.writer == engine_name]


# ---- command line ------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.writers", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    create = commands.add_parser("create", help="create the four upstreams (version 0)")
    create.add_argument("--lake", required=True)
    create.add_argument("--rows", type=int, required=True, help="rows of each upstream")
    create.add_argument("--seed", type=int, default=1)
    run = commands.add_parser("run", help="commit to one engine's upstreams until stopped (SIGTERM)")
    run.add_argument("--lake", required=True)
    run.add_argument("--engine", choices=(DELTA_RS, SPARK), required=True)
    run.add_argument("--commits-per-second", type=float, default=COMMITS_PER_SECOND,
                     help="over all four upstreams (default %(default)s)")
    run.add_argument("--seed", type=int, default=1)
    run.add_argument("--max-commits", type=int, default=None, help="per upstream (default: until stopped)")
    args = parser.parse_args(argv)
    if getattr(args, "rows", 1) < 1:
        parser.error("--rows must be 1 or more")
    if getattr(args, "commits_per_second", 1.0) <= 0:
        parser.error("--commits-per-second must be above 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "create":
        create_upstreams(args.lake, args.rows, args.seed)
        return 0
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    spark = spark_writer.writer_session("bench-writer-spark") if args.engine == SPARK else None
    engine = delta_rs_engine() if spark is None else spark_engine(spark)
    try:
        run_writer(open_upstreams(args.lake, args.engine, args.seed), engine, args.commits_per_second,
                   max_commits=args.max_commits, stop=stop, out=sys.stdout)
    finally:
        if spark is not None:
            spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
