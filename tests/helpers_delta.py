"""Small Delta helpers for tests that need no Spark: hand-built MVs and change feeds."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake


def write_mv_version(target: str, rows: pa.Table, app_id: str, watermark: int) -> int:
    """Overwrite a hand-built MV with `rows` and watermark `watermark` in one commit."""
    write_deltalake(
        target,
        rows,
        mode="overwrite",
        commit_properties=CommitProperties(app_transactions=[Transaction(app_id, watermark)]),
    )
    return DeltaTable(target).version()


def change_feed(uri: str, version: int) -> pa.Table:
    """The Change Data Feed rows of exactly one upstream version (string views as strings)."""
    reader = DeltaTable(uri).load_cdf(starting_version=version, ending_version=version)
    feed = pa.table(reader.read_all())
    schema = pa.schema([
        field.with_type(pa.string()) if pa.types.is_string_view(field.type) else field for field in feed.schema
    ])
    return feed.cast(schema)


def change_type_counts(uri: str, version: int) -> dict[str, int]:
    """How many feed rows of each `_change_type` one upstream version has."""
    return dict(Counter(change_feed(uri, version).column("_change_type").to_pylist()))


def mv_commits(target: str) -> list[dict]:
    """The MV's commits that carry the job's metadata (every commit with a watermark; not a
    snapshot's chunk commits), oldest first, each with its `airflow_backfill.*` fields
    read from the commit's userMetadata JSON as top-level keys."""
    commits = []
    for entry in sorted(DeltaTable(target).history(), key=lambda commit: commit["version"]):
        metadata = json.loads(entry.get("userMetadata") or "{}")
        if "airflow_backfill.phase" in metadata:
            commits.append({**entry, **metadata})
    return commits


def round_plans(target: str) -> list[str]:
    """How each catch-up or forward commit of the MV wrote its changes (its recorded plan)."""
    return [json.loads(commit["airflow_backfill.plan"])["plan"] for commit in mv_commits(target)
            if "airflow_backfill.plan" in commit]


def cycle_write_ways(monkeypatch, ways: tuple[str, ...] = ("merge", "replace", "overwrite")) -> None:
    """Make every incremental write take the next of `ways` in turn, whatever the estimates
    say, so that one test sees each way's change feed (tiny test tables would otherwise
    always be overwritten). Stateless rounds and an aggregate's writes each take their own
    turns, so that a chain of a stateless MV and an aggregate one cycles through the ways
    in both. A way that cannot apply a round's changes (a replace needs some new row, a
    delete none) leaves its turn to a later round, which a merge meanwhile writes."""
    from airflow_backfill.engine.aggregates import apply as aggregate_apply
    from airflow_backfill.engine.phases import apply

    turns = {"stateless": 0, "aggregate": 0}

    def next_usable(estimates, kind: str = "aggregate") -> str:
        way = ways[turns[kind] % len(ways)]
        if way not in estimates:
            return "merge"
        turns[kind] += 1
        return way

    planned = apply.plan_round

    def next_way(job, estimates, facts):
        chosen = planned(job, estimates, facts)
        if chosen.plan == "recompute":
            return chosen
        return dataclasses.replace(chosen, plan=next_usable(estimates, "stateless"))

    monkeypatch.setattr(apply, "plan_round", next_way)
    monkeypatch.setattr(aggregate_apply, "_cheapest", next_usable)


def unnamed_files(uri: str) -> set[str]:
    """The data files in the table's folder that no log entry names, and every deletion-vector
    file (the log names those by an encoded id): compared before and after a write, what
    the write left that no commit made part of the table."""
    import os
    from urllib.parse import unquote

    named: set[str] = set()
    log = os.path.join(uri, "_delta_log")
    for entry in sorted(os.listdir(log)):
        if not entry.endswith(".json"):
            continue
        with open(os.path.join(log, entry)) as handle:
            for line in handle:
                action = json.loads(line)
                for kind in ("add", "remove", "cdc"):
                    if kind in action:
                        named.add(unquote(action[kind]["path"]))
    found = set()
    for folder, _, names in os.walk(uri):
        if "_delta_log" in folder or "_airflow_backfill" in folder:
            continue
        for name in names:
            relative = os.path.relpath(os.path.join(folder, name), uri)
            if name.endswith(".parquet") and relative not in named:
                found.add(relative)
            elif name.startswith("deletion_vector_") and name.endswith(".bin"):
                found.add(relative)
    return found


def append_orders(uri: str, order_ids: list[int]) -> int:
    """Append copies of existing orders under `order_ids` (a plain delta-rs append); its version."""
    existing = DeltaTable(uri).to_pyarrow_table()
    rows = existing.slice(0, len(order_ids))
    index = rows.schema.get_field_index("order_id")
    rows = rows.set_column(index, rows.schema.field(index), pa.array(order_ids, rows.schema.field(index).type))
    write_deltalake(uri, rows, mode="append")
    return DeltaTable(uri).version()


def largest_order(uri: str) -> int:
    return pc.max(DeltaTable(uri).to_pyarrow_table(columns=["order_id"]).column("order_id")).as_py()


def delete_orders(uri: str, count: int) -> int:
    """Delete the `count` smallest orders in one commit (a plain delta-rs delete); its version."""
    ids = sorted(DeltaTable(uri).to_pyarrow_table(columns=["order_id"]).column("order_id").to_pylist())[:count]
    DeltaTable(uri).delete(f"order_id IN ({', '.join(str(i) for i in ids)})")
    return DeltaTable(uri).version()


def parquet_parts(folder, *tables: dict[str, list]) -> list[str]:
    """Write each table of columns as a Parquet file `part-<n>.parquet` in `folder` (row
    groups of three rows, so readers meet several); their paths."""
    import pyarrow.parquet as pq

    paths = []
    for number, columns in enumerate(tables):
        path = str(folder / f"part-{number}.parquet")
        pq.write_table(pa.table(columns), path, row_group_size=3)
        paths.append(path)
    return paths
