"""The two workloads of the `many_mvs` section: the upstreams, their writers and the MVs over them.

`users` (the default): the four upstreams of `user_tables`, written by delta-rs and by
Spark the way users' services write (`bench/writers.py`), and the fifty MVs of
`user_mvs`. `simulator`: five `orders` upstreams of the project's simulator, which only
appends ascending keys and updates and deletes through one MERGE a second, and the
original mix (60 % stateless, 30 % aggregates of which a third over stateless MVs, 10 %
joins). Both are created and written by processes of their own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.user_mvs import user_mv_declarations
from bench.user_tables import DELTA_RS, SPARK, TABLES

USERS, SIMULATOR = "users", "simulator"
WRITERS = (USERS, SIMULATOR)
SIMULATOR_UPSTREAMS = 5
UPSTREAM_ROWS = 20_000
STATUSES = ("pending", "shipped", "delivered", "cancelled")


@dataclass(frozen=True)
class Workload:
    """Which writers, how many rows an upstream, at what pace, from which seed."""

    writers: str = USERS
    rows: int = UPSTREAM_ROWS
    seed: int = 1
    commits_per_second: float = 2.0
    """users: commits a second over all four upstreams."""
    epoch_interval: float = 1.0
    """simulator: seconds between each upstream's epochs."""

    def upstreams(self, lake: Path) -> list[str]:
        if self.writers == USERS:
            return [str(lake / name) for name in TABLES]
        return [str(lake / f"upstream_{index}") for index in range(SIMULATOR_UPSTREAMS)]

    def jobs(self, lake: Path, mvs: int) -> list[dict[str, Any]]:
        """The job files' fields; the users' mix is its fifty MVs whatever `mvs` says."""
        return user_mv_declarations(str(lake)) if self.writers == USERS else mv_declarations(mvs, str(lake))

    def create(self, lake: Path, log: Path) -> subprocess.Popen:
        if self.writers == USERS:
            return module(log, "bench.writers", "create", "--lake", str(lake), "--rows", str(self.rows),
                          "--seed", str(self.seed))
        return python(CREATE_UPSTREAMS, log, str(self.rows), *self.upstreams(lake))

    def start_writers(self, lake: Path, logs: Path) -> list[subprocess.Popen]:
        """The writer processes; a users' writer prints one JSON line per commit."""
        if self.writers == SIMULATOR:
            return [python(WRITER, logs / "writer.log", str(self.epoch_interval), *self.upstreams(lake))]
        return [module(logs / f"writer-{engine}.log", "bench.writers", "run", "--lake", str(lake), "--engine", engine,
                       "--commits-per-second", str(self.commits_per_second), "--seed", str(self.seed))
                for engine in (DELTA_RS, SPARK)]


def mv_declarations(count: int, lake: str) -> list[dict[str, Any]]:
    """The simulator's mix: `count` jobs, 60 % stateless, 30 % aggregates (a third over
    stateless MVs), 10 % joins."""
    joins = max(1, count // 10) if count >= 5 else 0
    aggregates = max(1, (count * 3) // 10)
    stateless = max(1, count - joins - aggregates)
    upstream = [f"{lake}/upstream_{index}" for index in range(SIMULATOR_UPSTREAMS)]
    jobs: list[dict[str, Any]] = []
    for index in range(stateless):
        status = STATUSES[index % len(STATUSES)]
        jobs.append({
            "name": f"plain_{index}", "source": upstream[index % SIMULATOR_UPSTREAMS], "target": f"{lake}/plain_{index}",
            "query": (f"SELECT order_id, customer_id, status, amount * quantity AS total FROM source "
                      f"WHERE status <> '{status}'"),
            "primary_key": ["order_id"],
        })
    over_mvs = aggregates // 3
    for index in range(aggregates):
        over_mv = index < over_mvs
        source = f"{lake}/plain_{index % stateless}" if over_mv else upstream[index % SIMULATOR_UPSTREAMS]
        value = "total" if over_mv else "amount * quantity"
        group = "status" if index % 2 else "customer_id % 50"
        jobs.append({
            "name": f"agg_{index}", "source": source, "target": f"{lake}/agg_{index}",
            "query": (f"SELECT {group} AS bucket, COUNT(*) AS orders, SUM({value}) AS revenue FROM source "
                      f"GROUP BY {group}"),
            "primary_key": ["order_id"],
        })
    for index in range(joins):
        left, right = upstream[index % SIMULATOR_UPSTREAMS], upstream[(index + 1) % SIMULATOR_UPSTREAMS]
        jobs.append({
            "name": f"join_{index}", "target": f"{lake}/join_{index}",
            "sources": {"a": {"table": left, "primary_key": ["order_id"]},
                        "b": {"table": right, "primary_key": ["order_id"]}},
            "query": ("SELECT a.order_id, a.status, a.amount, b.status AS other_status, b.amount AS other_amount "
                      "FROM a JOIN b ON a.order_id = b.order_id"),
        })
    for job in jobs:
        job.update(backfill_parallelism=2, parallelism=1, lag_threshold=0, poll_interval=0.5)
    return jobs


def env_with_checkout() -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}


def python(code: str, log: Path, *args: str) -> subprocess.Popen:
    return _started([sys.executable, "-c", code, *args], log)


def module(log: Path, name: str, *args: str) -> subprocess.Popen:
    return _started([sys.executable, "-m", name, *args], log)


def _started(command: list[str], log: Path) -> subprocess.Popen:
    with open(log, "w") as output:
        return subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env_with_checkout(),
                                start_new_session=True)


CREATE_UPSTREAMS = """
import sys
from airflow_backfill.simulator import create_orders_table
for index, uri in enumerate(sys.argv[2:]):
    create_orders_table(uri, int(sys.argv[1]), seed=index)
"""

WRITER = """
import random, sys, time
from airflow_backfill.simulator import commit_epoch
interval, uris = float(sys.argv[1]), sys.argv[2:]
rng = random.Random(7)
next_at = time.monotonic()
while True:
    for uri in uris:
        commit_epoch(uri, rng, inserts=20, updates=20, deletes=2)
    next_at += interval
    time.sleep(max(0.0, next_at - time.monotonic()))
"""
