"""The oracle of a source backfill: the MV equals the query over every produced record at or
below its partition's committed split offset (computed here in Python, independently of Spark)."""

from __future__ import annotations

from typing import Any

from deltalake import DeltaTable, QueryBuilder

from airflow_backfill.kafka.positions import backfill_position
from airflow_backfill.kafka.simulator import ProducedRecord

QUERY = (
    "SELECT id, customer, amount * 2 AS doubled, _partition, _offset "
    "FROM source WHERE kind <> 'skip'"
)


def expected_rows(produced: list[ProducedRecord], offsets: dict[int, int]) -> list[tuple[Any, ...]]:
    rows = [
        (r.value["id"], r.value["customer"], r.value["amount"] * 2, r.partition, r.offset)
        for r in produced
        if r.offset <= offsets.get(r.partition, -1) and r.value["kind"] != "skip"
    ]
    return sorted(rows)


def mv_rows(target: str) -> list[tuple[Any, ...]]:
    table = QueryBuilder().register("t", DeltaTable(target)).execute(
        "select id, customer, doubled, _partition, _offset from t"
    ).read_all()
    import pyarrow as pa

    data = pa.table(table).to_pylist()
    return sorted((r["id"], r["customer"], r["doubled"], r["_partition"], r["_offset"]) for r in data)


def assert_oracle(target: str, produced: list[ProducedRecord]) -> dict[int, int]:
    """Check the MV against the oracle at its latest commit; the split offsets it was checked at."""
    offsets = backfill_position(target).offsets
    actual = mv_rows(target)
    expected = expected_rows(produced, offsets)
    assert len(actual) == len(set(actual)), "the MV holds a record twice"
    assert actual == expected, (f"MV differs from the oracle at offsets {offsets}: {len(actual)} vs {len(expected)} "
                                f"rows; {_difference(actual, expected)}; MV commits: {_history(target)}")
    return offsets


def _difference(actual: list[tuple[Any, ...]], expected: list[tuple[Any, ...]]) -> str:
    """Which (partition, offset) ranges the MV lacks or has beyond the oracle, for a failure's message."""
    def ranges(rows: set[tuple[Any, ...]]) -> dict[int, list[tuple[int, int]]]:
        found: dict[int, list[tuple[int, int]]] = {}
        for partition, offset in sorted((row[3], row[4]) for row in rows):
            spans = found.setdefault(partition, [])
            if spans and spans[-1][1] >= offset - 3:  # skipped records leave small gaps
                spans[-1] = (spans[-1][0], offset)
            else:
                spans.append((offset, offset))
        return found

    return f"missing {ranges(set(expected) - set(actual))}, extra {ranges(set(actual) - set(expected))}"


def _history(target: str) -> list[dict[str, Any]]:
    return [{"version": entry.get("version"), "operation": entry.get("operation"),
             "rows": entry.get("operationMetrics", {}).get("numOutputRows"), "metadata": entry.get("userMetadata")}
            for entry in DeltaTable(target).history()]


def assert_source_table(table: str, produced: list[ProducedRecord]) -> dict[int, int]:
    """The source job's table holds every produced record at or below its committed offsets,
    each once; the offsets it was checked at."""
    import pyarrow as pa

    from airflow_backfill.kafka.positions import source_position

    offsets = source_position(table).offsets
    data = pa.table(QueryBuilder().register("t", DeltaTable(table)).execute(
        "select id, _partition, _offset from t").read_all()).to_pylist()
    actual = sorted((r["_partition"], r["_offset"], r["id"]) for r in data)
    expected = sorted((r.partition, r.offset, r.value["id"]) for r in produced if r.offset <= offsets.get(r.partition, -1))
    assert len(actual) == len(set(actual)), "the source table holds a record twice"
    assert actual == expected, f"source table differs from the records at offsets {offsets}: {len(actual)} vs {len(expected)}"
    return offsets
