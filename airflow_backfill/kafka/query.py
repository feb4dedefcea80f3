"""What a query over a Kafka topic is: per-record, or a GROUP BY that records only ever add to."""

from __future__ import annotations

from airflow_backfill.engine.planning.aggregate_query import COUNT_DISTINCT
from airflow_backfill.engine.planning.query import AGGREGATE, QueryPlan, plan_query
from airflow_backfill.exceptions import UnsupportedQueryError


def aggregate_plan(query: str) -> QueryPlan | None:
    """The aggregate plan of a Kafka MV's query, None for a per-record query; refuses what
    an append-only aggregate cannot maintain."""
    plan = plan_query(query, ())
    if plan.kind != AGGREGATE:
        return None
    assert plan.aggregate is not None
    if any(call.function == COUNT_DISTINCT for call in plan.aggregate.calls):
        raise UnsupportedQueryError(
            "COUNT(DISTINCT ...) is not supported over a Kafka topic: it would read every earlier record of "
            "a group again. Use COUNT, SUM, AVG, MIN or MAX, or aggregate a per-record MV with a second job."
        )
    return plan
