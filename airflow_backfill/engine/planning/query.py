"""Classify the MV query with sqlglot and derive what incremental maintenance needs.

The engine maintains a query incrementally only when it can prove how a change to one
upstream row changes the MV. Two kinds qualify:

- *stateless* (projections, deterministic expressions, WHERE): one upstream row maps to
  at most one MV row, keyed by the upstream primary key the query selects unchanged;
- *aggregate* (GROUP BY with COUNT, SUM, AVG, MIN, MAX, COUNT(DISTINCT), optional WHERE
  and HAVING): one MV row per group, keyed by the GROUP BY keys; see
  `aggregate_query` and docs/aggregates.md.

Anything else is refused here, by name, before any Spark work starts.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError

from airflow_backfill.engine.planning.aggregate_query import AggregateQuery, analyse_aggregate, is_aggregate
from airflow_backfill.exceptions import UnsupportedQueryError

SOURCE_TABLE = "source"
"""The table name the MV query reads; bound to the upstream (or its changes) at run time."""

_NON_DETERMINISTIC_CLASSES: tuple[type[exp.Expr], ...] = tuple(
    cls
    for cls in (
        getattr(exp, name, None)
        for name in ("Rand", "Randn", "Uuid", "CurrentTimestamp", "CurrentDate", "CurrentTime",
                     "CurrentDatetime", "Random", "UnixTimestamp", "Shuffle")
    )
    if isinstance(cls, type)
)
_NON_DETERMINISTIC_NAMES = frozenset(
    {
        "now", "rand", "randn", "random", "uuid", "shuffle", "current_timestamp", "current_date",
        "localtimestamp", "unix_timestamp", "monotonically_increasing_id", "spark_partition_id",
        "input_file_name", "input_file_block_start", "input_file_block_length", "try_reflect",
        "reflect", "java_method", "rand_str", "randstr", "uniform",
    }
)


@dataclass(frozen=True)
class QueryPlan:
    """What the engine derived from the MV query."""

    query: str
    kind: str
    """'stateless': one MV row per upstream row at most; 'aggregate': one MV row per group."""
    upstream_key: tuple[str, ...]
    """The upstream primary-key columns, as declared by the job."""
    mv_key: tuple[str, ...]
    """The MV's primary-key columns: the output names of `upstream_key` (stateless) or of
    the GROUP BY keys (aggregate), same order."""
    aggregate: AggregateQuery | None = None
    """The grouped aggregate's parts; set exactly when kind is 'aggregate'."""
    filters_rows: bool = False
    """The query has a WHERE: the MV lacks the upstream rows it drops, so the MV alone cannot
    tell whether an upstream key is already held."""


def referenced_columns(query: str) -> frozenset[str] | None:
    """Lower-cased names of the upstream columns the query reads (as a column, or as the
    struct a field is read from); None when it selects `*`, which reads them all."""
    select = parse_single_select(query)
    if any(isinstance(node, exp.Star) for node in select.walk()):
        return None
    return frozenset(part.name.lower() for column in select.find_all(exp.Column) for part in column.parts)


STATELESS = "stateless"
AGGREGATE = "aggregate"


@functools.lru_cache(maxsize=128)
def plan_query(query: str, primary_key: tuple[str, ...]) -> QueryPlan:
    """Parse, classify and key the MV query; raise UnsupportedQueryError naming the construct.

    Cached (the plan is immutable): every phase and round of a job plans the same query.
    """
    select = parse_single_select(query)
    _refuse_unsupported_constructs(select)
    if is_aggregate(select):
        aggregate = analyse_aggregate(select)
        return QueryPlan(query=query, kind=AGGREGATE, upstream_key=tuple(primary_key),
                         mv_key=aggregate.key_outputs, aggregate=aggregate)
    mv_key = _mv_key(select, primary_key)
    return QueryPlan(query=query, kind=STATELESS, upstream_key=tuple(primary_key), mv_key=mv_key,
                     filters_rows=select.args.get("where") is not None)


def parse_single_select(query: str) -> exp.Select:
    try:
        statements = [s for s in sqlglot.parse(query, read="spark") if s is not None]
    except ParseError as error:
        raise UnsupportedQueryError(f"the query is not valid Spark SQL: {error}") from None
    if len(statements) != 1:
        raise UnsupportedQueryError(
            f"the query must be exactly one SELECT statement, found {len(statements)} statements."
        )
    statement = statements[0]
    if isinstance(statement, exp.Union | exp.Intersect | exp.Except):
        raise UnsupportedQueryError(
            f"{type(statement).__name__.upper()} is not supported; the MV must be one SELECT over `source`."
        )
    if not isinstance(statement, exp.Select):
        raise UnsupportedQueryError(
            f"the query must be a SELECT over `{SOURCE_TABLE}`, got a {statement.key.upper()} statement."
        )
    return statement


def _refuse_unsupported_constructs(select: exp.Select) -> None:
    if select.args.get("with_") is not None or select.args.get("with") is not None:
        _refuse("WITH (common table expressions)")
    if select.args.get("joins"):
        _refuse("JOIN")
    refuse_unmaintained_clauses(select)
    _refuse_sources(select)
    refuse_unmaintained_expressions(select)


def _refuse(construct: str) -> None:
    raise UnsupportedQueryError(
        f"{construct} is not supported in this version: only stateless queries "
        "(projections, deterministic expressions, WHERE) and grouped aggregates (GROUP BY with "
        "COUNT, SUM, AVG, MIN, MAX, COUNT(DISTINCT), HAVING) can be maintained incrementally."
    )


def refuse_unmaintained_clauses(select: exp.Select) -> None:
    """Refuse the clauses no MV can keep (DISTINCT, LIMIT, ORDER BY, ...), by name; a join's
    query is held to them too."""
    refusals: list[tuple[bool, str]] = [
        (select.args.get("distinct") is not None, "DISTINCT (use GROUP BY over the selected columns)"),
        (select.args.get("limit") is not None, "LIMIT"),
        (select.args.get("offset") is not None, "OFFSET"),
        (select.args.get("order") is not None, "ORDER BY (an MV is an unordered table)"),
        (select.args.get("qualify") is not None, "QUALIFY"),
        (select.args.get("laterals") is not None and bool(select.args.get("laterals")), "LATERAL VIEW"),
    ]
    for refused, construct in refusals:
        if refused:
            _refuse(construct)


def refuse_unmaintained_expressions(select: exp.Select) -> None:
    """Refuse aggregates in WHERE, windows, subqueries and non-deterministic functions."""
    where = select.args.get("where")
    for node in where.walk() if where is not None else ():
        if isinstance(node, exp.AggFunc):
            raise UnsupportedQueryError(
                f"aggregate function {node.sql(dialect='spark')} in WHERE is not allowed; "
                "filter groups with HAVING instead."
            )
    for node in select.walk():
        if isinstance(node, exp.Window):
            raise UnsupportedQueryError(
                "window functions (OVER ...) are not supported: they cannot be maintained incrementally."
            )
        if isinstance(node, exp.Subquery | exp.Exists) or (
            node is not select and isinstance(node, exp.Select)
        ):
            raise UnsupportedQueryError("subqueries are not supported; select from `source` directly.")
        if _is_non_deterministic(node):
            raise UnsupportedQueryError(
                f"non-deterministic function {node.sql(dialect='spark')} is not supported: a "
                "recomputation would not match the maintained MV. Compute it upstream instead."
            )


def _refuse_sources(select: exp.Select) -> None:
    source = select.args.get("from_") or select.args.get("from")
    if source is None:
        raise UnsupportedQueryError(f"the query must read FROM {SOURCE_TABLE}.")
    table = source.this
    if not isinstance(table, exp.Table) or table.name.lower() != SOURCE_TABLE or table.db:
        raise UnsupportedQueryError(
            f"the query must read FROM {SOURCE_TABLE} (the upstream), got FROM {table.sql(dialect='spark')}."
        )


def _is_non_deterministic(node: exp.Expr) -> bool:
    if _NON_DETERMINISTIC_CLASSES and isinstance(node, _NON_DETERMINISTIC_CLASSES):
        return True
    if isinstance(node, exp.Anonymous):
        return str(node.name).lower() in _NON_DETERMINISTIC_NAMES
    return False


def _mv_key(select: exp.Select, primary_key: tuple[str, ...]) -> tuple[str, ...]:
    """Map each upstream key column to the output column that carries it unchanged."""
    carried: dict[str, str] = {}
    output_names: list[str] = []
    for projection in select.expressions:
        if isinstance(projection, exp.Star):
            for column in primary_key:
                carried.setdefault(column.lower(), column)
            continue
        inner = projection.this if isinstance(projection, exp.Alias) else projection
        output = projection.alias_or_name
        output_names.append(output)
        if isinstance(inner, exp.Column) and not inner.table and isinstance(inner.this, exp.Identifier):
            carried.setdefault(inner.name.lower(), output)
    duplicates = sorted({name for name in output_names if output_names.count(name) > 1})
    if duplicates:
        raise UnsupportedQueryError(
            f"the query outputs column(s) {', '.join(duplicates)} more than once; give each an alias."
        )
    missing = [column for column in primary_key if column.lower() not in carried]
    if missing:
        raise UnsupportedQueryError(
            f"the MV's primary key must be derivable from the upstream's: the query must select "
            f"the primary-key column(s) {', '.join(missing)} unchanged (optionally renamed), "
            f"e.g. SELECT {missing[0]}, ... FROM source."
        )
    return tuple(carried[column.lower()] for column in primary_key)
