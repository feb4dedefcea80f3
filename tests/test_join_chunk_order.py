"""A snapshot chunk of the largest upstream meets the other tables already joined with
each other when every join is INNER, and in the query's own order with a LEFT join; the
rows are those of the table-by-table walk either way."""

from __future__ import annotations

import pytest
from join_upstreams import create_all, sources
from test_joins import QUERIES

from airflow_backfill.engine.joins.relation import chunk_joined, flat_rows, reader, walk
from airflow_backfill.engine.joins.rounds import join_plan
from airflow_backfill.job import BackfillJob

pytestmark = pytest.mark.spark


def _top_join_sides(frame) -> tuple[int, int]:
    """The upstream tables read under each side of the plan's topmost join."""
    node = frame._jdf.queryExecution().analyzed()
    while node.getClass().getSimpleName() != "Join":
        node = node.children().head()
    return node.left().collectLeaves().size(), node.right().collectLeaves().size()


@pytest.mark.parametrize(("query", "sides"), [("inner_chain", (1, 2)), ("left_chain_of_four", (3, 1))])
def test_a_chunk_meets_the_joined_tables_last_when_every_join_is_inner(spark, tmp_path, query, sides):
    sql, names, key = QUERIES[query]
    tables = create_all(str(tmp_path), seed=7, names=names)
    job = BackfillJob(name="joined", target=str(tmp_path / "mv"), query=sql, sources=sources(tables))
    plan = join_plan(job)
    read = reader(spark, job, plan, {name: table.version() for name, table in tables.items()})
    chunked = plan.index("items")
    rows = flat_rows(read(chunked), plan, chunked)
    joined = chunk_joined(plan, chunked, rows, read, bounded=True)
    walked = walk(plan, chunked, rows, read, semi_join=False, bounded=True)
    assert joined.columns == walked.columns
    assert sorted(map(str, joined.collect())) == sorted(map(str, walked.collect()))
    assert joined.count() > 0
    assert _top_join_sides(joined) == sides
