"""The users' writers of the many_mvs benchmark (bench/writers.py): what they commit is what
users' services commit, and the upstream's key stays a key.

The plan of each commit is checked without any table (kinds, sizes, keys, the seed); then
the writers run for real at a tiny size, delta-rs and Spark (the session's), and the
history they made is read back: every kind of commit appears, re-inserted keys and
upserts that both match and insert are in it, Spark committed with deletion vectors, and
each version of each upstream holds every key once.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from bench.commit_mix import (
    APPEND,
    DELETE,
    KINDS,
    MAX_ROWS,
    REINSERT,
    UPDATE,
    UPSERT,
    KeyBook,
    commit_size,
    plan_commit,
)
from bench.user_tables import SPARK, TABLES


def planned(seed: int, commits: int, rows: int = 1_000) -> list:
    rng, book, plans = random.Random(seed), KeyBook(rows), []
    for _ in range(commits):
        plan = plan_commit(rng, book)
        plans.append(plan)
        book.apply(plan)
    return plans


def test_commits_are_of_every_kind_most_of_them_small_and_never_repeat_a_key():
    rng, book = random.Random(3), KeyBook(1_000)
    held = set(range(1_000))
    kinds: Counter = Counter()
    for _ in range(400):
        plan = plan_commit(rng, book)
        kinds[plan.kind] += 1
        assert 1 <= plan.rows <= MAX_ROWS
        assert not set(plan.inserted) & held, "an insert of a key the table holds"
        assert set(plan.updated) <= held and set(plan.deleted) <= held, "a change of a key the table lacks"
        if plan.kind == REINSERT:
            assert set(plan.inserted) <= book.deleted
        book.apply(plan)
        held = (held - set(plan.deleted)) | set(plan.inserted)
        assert held == set(range(book.next_index)) - book.deleted
    assert set(kinds) == set(KINDS)
    sizes = sorted(commit_size(random.Random(seed)) for seed in range(2_000))
    assert sizes[len(sizes) // 2] <= 40 < sizes[-1], "most commits small, some large"


def test_the_same_seed_makes_the_same_commits_and_rows():
    assert planned(11, 50) == planned(11, 50)
    assert planned(11, 50) != planned(12, 50)
    for table in TABLES.values():
        first = table.rows(np.arange(5, 40), np.random.default_rng(4), 100)
        again = table.rows(np.arange(5, 40), np.random.default_rng(4), 100)
        assert first.equals(again) and first.schema.equals(table.schema)


def test_each_index_names_one_key_and_back():
    for table in TABLES.values():
        indices = [0, 1, 7, 999, 123_456, 1_999_999]
        keys = table.keys_of(indices)
        assert len(set(keys)) == len(keys)
        assert [table.index_of(key) for key in keys] == indices
        rows = table.rows(np.asarray(indices), np.random.default_rng(0), 10)
        assert list(zip(*(rows.column(c).to_pylist() for c in table.key), strict=True)) == keys
    codes = [key[0] for key in TABLES["customers"].keys_of(range(50))]
    assert codes != sorted(codes), "customer codes are not in the order they were created"


# ---- the writers for real ---------------------------------------------------------------

ROWS = 40
DELTA_RS_COMMITS = 14
SPARK_COMMITS = 3
SEED = 5


def keys_at(uri: str, key: tuple[str, ...], version: int) -> list[tuple]:
    from deltalake import DeltaTable, QueryBuilder

    read = QueryBuilder().register("t", DeltaTable(uri, version=version)).execute(
        f"SELECT {', '.join(key)} FROM t").read_all()
    table = pa.table(read)
    return list(zip(*(table.column(name).to_pylist() for name in key), strict=True))


def change_types(spark, uri: str) -> dict[int, Counter]:
    """Per version, the change feed's row types, read by Spark (deletion vectors included)."""
    feed = spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 1).load(uri)
    found: dict[int, Counter] = {}
    for row in feed.groupBy("_commit_version", "_change_type").count().collect():
        found.setdefault(row["_commit_version"], Counter())[row["_change_type"]] = row["count"]
    return found


def log_entries(uri: str, version: int) -> list[dict]:
    return [json.loads(line) for line in (Path(uri) / "_delta_log" / f"{version:020d}.json").read_text().splitlines()]


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_the_writers_history_holds_every_kind_of_commit_and_a_unique_key(spark, tmp_path: Path):
    from bench.writers import create_upstreams, delta_rs_engine, open_upstreams, run_writer, spark_engine

    lake = tmp_path / "lake"
    uris = create_upstreams(lake, ROWS, SEED, spark=spark)
    records = run_writer(open_upstreams(lake, "delta-rs", SEED), delta_rs_engine(), 1_000.0,
                         max_commits=DELTA_RS_COMMITS)
    records += run_writer(open_upstreams(lake, SPARK, SEED), spark_engine(spark), 1_000.0, max_commits=SPARK_COMMITS)

    # The writer made exactly the commits its seed plans, each one version.
    for name, table in TABLES.items():
        mine = [record for record in records if record["table"] == name]
        replay = planned_for(table, uris[name], len(mine))
        assert [(r["kind"], r["rows"]) for r in mine] == [(p.kind, p.rows) for p in replay]
        assert [r["version"] for r in mine] == list(range(1, len(mine) + 1))
    assert {record["kind"] for record in records} == {APPEND, UPDATE, DELETE, REINSERT, UPSERT}

    reinserted = upserted_both = 0
    for name, table in TABLES.items():
        seen: set[tuple] = set()
        previous: set[tuple] = set()
        for version in range(len([r for r in records if r["table"] == name]) + 1):
            keys = keys_at(uris[name], table.key, version)
            assert len(keys) == len(set(keys)), f"{name} holds a key twice at version {version}"
            reinserted += bool((set(keys) - previous) & seen)
            previous = set(keys)
            seen |= previous
        feed = change_types(spark, uris[name])
        upserted_both += sum(1 for record in records if record["table"] == name and record["kind"] == UPSERT
                             and feed[record["version"]]["insert"] and feed[record["version"]]["update_postimage"])
    assert reinserted >= 1, "no version brought back a key an earlier version had lost"
    assert upserted_both >= 1, "no upsert both updated held keys and inserted new ones"

    payments = uris["payments"]
    spark_versions = [record["version"] for record in records if record["table"] == "payments"]
    infos = [next(e["commitInfo"] for e in log_entries(payments, v) if "commitInfo" in e) for v in spark_versions]
    assert all(info["engineInfo"].startswith("Apache-Spark") for info in infos)
    assert any(info["operation"] in ("MERGE", "UPDATE", "DELETE") for info in infos)
    deletion_vectors = [e["add"] for v in spark_versions for e in log_entries(payments, v)
                        if "add" in e and e["add"].get("deletionVector")]
    assert deletion_vectors, "Spark's changes in place were not written with deletion vectors"
    for name in ("orders", "customers", "line_items"):
        assert all(next(e["commitInfo"] for e in log_entries(uris[name], v) if "commitInfo" in e)["engineInfo"]
                   .startswith("delta-rs") for v in range(1, DELTA_RS_COMMITS + 1))


def planned_for(table, uri: str, commits: int) -> list:
    """The plans the writer's seed gives a table just created (its random source is seeded
    by the seed, the table and its version, 0)."""
    rng, book, plans = random.Random(f"{SEED}/{table.name}/0"), KeyBook(ROWS), []
    for _ in range(commits):
        plan = plan_commit(rng, book)
        if plan.kind in (APPEND, REINSERT, UPSERT):
            rng.getrandbits(64)  # the rows' generator draws its seed here
        plans.append(plan)
        book.apply(plan)
    return plans
