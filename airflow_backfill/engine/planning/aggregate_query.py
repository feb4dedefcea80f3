"""Analyse a grouped aggregate MV query into the parts incremental maintenance needs.

A supported aggregate query is one SELECT over `source` with an optional WHERE, a GROUP
BY list, aggregate calls among COUNT(*), COUNT(x), SUM(x), AVG(x), MIN(x), MAX(x) and
COUNT(DISTINCT x), and an optional HAVING. Everything outside the aggregate calls (the
projections and HAVING) may be any deterministic expression over GROUP BY keys and
aggregate results, because the engine evaluates it over the per-group state.

The analysis names three kinds of columns the generated SQL uses:

- `__g<i>`: the value of GROUP BY expression i (the group's key in the state),
- `__x<j>`: the value of aggregate argument j for one upstream row (before grouping),
- `__v<k>`: the result of aggregate call k for one group (after grouping).

The projections and HAVING are kept as Spark SQL over `__g*`/`__v*`, so they can be
evaluated over the state table without the upstream.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlglot import exp
from sqlglot.optimizer.normalize_identifiers import normalize_identifiers

from airflow_backfill.exceptions import UnsupportedQueryError

COUNT_STAR = "count_star"
COUNT = "count"
SUM = "sum"
AVG = "avg"
MIN = "min"
MAX = "max"
COUNT_DISTINCT = "count_distinct"

ALGEBRAIC = frozenset({COUNT_STAR, COUNT, SUM, AVG})
"""Maintained by adding signed deltas: never needs the upstream again."""
RECOMPUTED = frozenset({MIN, MAX, COUNT_DISTINCT})
"""Recomputed from the upstream for the groups whose value a change may have moved."""

_SUPPORTED = "COUNT(*), COUNT(x), SUM(x), AVG(x), MIN(x), MAX(x) and COUNT(DISTINCT x)"
_KNOWN_AGGREGATE_NAMES = frozenset({
    "try_sum", "try_avg", "bit_and", "bit_or", "bit_xor", "every", "some", "bool_or", "bool_and",
    "collect_set", "collect_list", "array_agg", "histogram_numeric", "count_min_sketch", "mode",
    "median", "percentile", "percentile_approx", "approx_percentile", "hll_sketch_agg",
    "hll_union_agg", "regr_count", "kurtosis", "skewness", "listagg", "string_agg",
})
"""Spark aggregate functions sqlglot parses as plain function calls; refused by name."""


@dataclass(frozen=True)
class AggregateCall:
    """One distinct aggregate call of the query (in SELECT or HAVING)."""

    function: str
    """One of count_star, count, sum, avg, min, max, count_distinct."""
    argument: int | None
    """Index j of its argument `__x<j>`; None for COUNT(*)."""
    sql: str
    """The call as written, for messages."""


@dataclass(frozen=True)
class AggregateQuery:
    """A grouped aggregate, split into row-level, group-level and output parts."""

    group_by: tuple[str, ...]
    """Spark SQL over `source` of each GROUP BY expression (state column `__g<i>`)."""
    where: str | None
    """Spark SQL over `source` of the WHERE condition, applied before grouping."""
    arguments: tuple[str, ...]
    """Spark SQL over `source` of each distinct aggregate argument (`__x<j>`)."""
    calls: tuple[AggregateCall, ...]
    """Each distinct aggregate call; call k's result is `__v<k>`."""
    projections: tuple[str, ...]
    """Spark SQL over `__g*`/`__v*` of each output column, in SELECT order."""
    output_names: tuple[str | None, ...]
    """Each output column's name when the query names it; None when Spark derives it."""
    key_outputs: tuple[str, ...]
    """The output name of each GROUP BY key, in GROUP BY order: the MV's primary key."""
    having: str | None
    """Spark SQL over `__g*`/`__v*` of HAVING: groups failing it are kept but not shown."""

    def functions_of(self, argument: int) -> frozenset[str]:
        """The aggregate functions applied to argument j."""
        return frozenset(call.function for call in self.calls if call.argument == argument)

    @property
    def needs_recompute(self) -> bool:
        """True when some aggregate cannot be maintained from the change feed alone."""
        return any(call.function in RECOMPUTED for call in self.calls)


def is_aggregate(select: exp.Select) -> bool:
    """A GROUP BY, a HAVING or an aggregate call anywhere in the select list makes it one."""
    if select.args.get("group") is not None or select.args.get("having") is not None:
        return True
    return any(_is_aggregate_call(node) for item in select.expressions for node in item.walk())


def analyse_aggregate(select: exp.Select) -> AggregateQuery:
    """Split a grouped aggregate; raise UnsupportedQueryError naming what cannot be maintained."""
    group = select.args.get("group")
    if group is None:
        first = next(
            (node for item in select.expressions for node in item.walk() if _is_aggregate_call(node)), None
        )
        construct = f"aggregate function {first.sql(dialect='spark')}" if first is not None else "HAVING"
        raise UnsupportedQueryError(
            f"{construct} without GROUP BY (a global aggregate) is not supported: add a GROUP BY "
            "key and select it, e.g. SELECT region, SUM(amount) AS total FROM source GROUP BY region."
        )
    items = list(select.expressions)
    if any(isinstance(item, exp.Star) for item in items):
        raise UnsupportedQueryError("SELECT * cannot be combined with GROUP BY; list the keys and aggregates.")
    where = select.args.get("where")
    if where is not None:
        _refuse_aggregates_in(where.this, "WHERE")
    group_exprs = _group_expressions(group, items)
    arguments: list[exp.Expr] = []
    calls: list[AggregateCall] = []
    call_keys: list[tuple[str, int | None]] = []
    group_keys = [_canonical(expr) for expr in group_exprs]

    def rewrite(node: exp.Expr, context: str) -> exp.Expr:
        return _rewrite_over_state(node, group_keys, arguments, calls, call_keys, context)

    projections = [rewrite(_inner(item), "SELECT") for item in items]
    names = [_output_name(item) for item in items]
    _refuse_duplicate_names(names)
    having = select.args.get("having")
    having_sql = None
    if having is not None:
        having_sql = rewrite(_resolve_aliases(having.this, items, group_keys), "HAVING").sql(dialect="spark")
    return AggregateQuery(
        group_by=tuple(expr.sql(dialect="spark") for expr in group_exprs),
        where=where.this.sql(dialect="spark") if where is not None else None,
        arguments=tuple(arg.sql(dialect="spark") for arg in arguments),
        calls=tuple(calls),
        projections=tuple(p.sql(dialect="spark") for p in projections),
        output_names=tuple(names),
        key_outputs=_key_outputs(group_exprs, items, names),
        having=having_sql,
    )


def _is_aggregate_call(node: exp.Expr) -> bool:
    if isinstance(node, exp.AggFunc | exp.Filter):
        return True
    return isinstance(node, exp.Anonymous) and str(node.name).lower() in _KNOWN_AGGREGATE_NAMES


def _refuse_aggregates_in(node: exp.Expr, clause: str) -> None:
    for child in node.walk():
        if _is_aggregate_call(child):
            raise UnsupportedQueryError(
                f"aggregate function {child.sql(dialect='spark')} in {clause} is not allowed; "
                "filter groups with HAVING instead."
            )


def _inner(item: exp.Expr) -> exp.Expr:
    return item.this if isinstance(item, exp.Alias) else item


def _output_name(item: exp.Expr) -> str | None:
    if isinstance(item, exp.Alias) or isinstance(item, exp.Column):
        return item.alias_or_name
    return None


def _refuse_duplicate_names(names: list[str | None]) -> None:
    lowered = [name.lower() for name in names if name is not None]
    duplicates = sorted({name for name in lowered if lowered.count(name) > 1})
    if duplicates:
        raise UnsupportedQueryError(
            f"the query outputs column(s) {', '.join(duplicates)} more than once; give each an alias."
        )


def _canonical(node: exp.Expr) -> str:
    """A comparison key: identifiers case-folded as Spark does, `source.` qualifiers dropped."""
    copy = node.copy()
    for column in list(copy.find_all(exp.Column)):
        column.set("table", None)
    return normalize_identifiers(copy, dialect="spark").sql(dialect="spark")


def _group_expressions(group: exp.Group, items: list[exp.Expr]) -> list[exp.Expr]:
    """GROUP BY entries as expressions over `source`: ordinals and aliases resolved."""
    for construct in ("rollup", "cube", "grouping_sets", "totals"):
        if group.args.get(construct):
            raise UnsupportedQueryError(f"GROUP BY {construct.upper().replace('_', ' ')} is not supported.")
    resolved: list[exp.Expr] = []
    for entry in group.expressions:
        if isinstance(entry, exp.Rollup | exp.Cube | exp.GroupingSets):
            raise UnsupportedQueryError(
                f"GROUP BY {entry.sql(dialect='spark')} is not supported: only plain GROUP BY keys."
            )
        expr = _resolve_group_entry(entry, items)
        _refuse_aggregates_in(expr, "GROUP BY")
        if _canonical(expr) not in {_canonical(done) for done in resolved}:
            resolved.append(expr)
    if not resolved:
        raise UnsupportedQueryError("GROUP BY needs at least one key.")
    return resolved


def _resolve_group_entry(entry: exp.Expr, items: list[exp.Expr]) -> exp.Expr:
    if isinstance(entry, exp.Literal) and not entry.is_string:
        position = int(entry.this)
        if not 1 <= position <= len(items):
            raise UnsupportedQueryError(
                f"GROUP BY {position} refers to no SELECT column (the query selects {len(items)})."
            )
        return _inner(items[position - 1])
    if isinstance(entry, exp.Column) and not entry.table:
        name = entry.name.lower()
        for item in items:
            if isinstance(item, exp.Alias) and item.alias.lower() == name:
                inner = item.this
                if not (isinstance(inner, exp.Column) and inner.name.lower() == name):
                    return inner
    return entry


def _key_outputs(group_exprs: list[exp.Expr], items: list[exp.Expr], names: list[str | None]) -> tuple[str, ...]:
    """The output column of each GROUP BY key: the MV's key must be selected."""
    outputs: list[str] = []
    for expr in group_exprs:
        key = _canonical(expr)
        match = next((i for i, item in enumerate(items) if _canonical(_inner(item)) == key), None)
        if match is None:
            raise UnsupportedQueryError(
                f"the GROUP BY key {expr.sql(dialect='spark')} must be selected: the MV's primary key is "
                f"the GROUP BY key list. Add it to the SELECT list, e.g. SELECT {expr.sql(dialect='spark')}, ..."
            )
        name = names[match]
        if name is None:
            raise UnsupportedQueryError(
                f"give the GROUP BY key {expr.sql(dialect='spark')} an alias in the SELECT list "
                f"(e.g. {expr.sql(dialect='spark')} AS key): it is part of the MV's primary key."
            )
        outputs.append(name)
    return tuple(outputs)


def _resolve_aliases(condition: exp.Expr, items: list[exp.Expr], group_keys: list[str]) -> exp.Expr:
    """HAVING may name SELECT aliases (as Spark allows); replace them by their expressions."""
    aliases = {item.alias.lower(): item.this for item in items if isinstance(item, exp.Alias)}

    def substitute(node: exp.Expr) -> exp.Expr:
        if _is_aggregate_call(node):
            return node
        if isinstance(node, exp.Column) and not node.table and _canonical(node) not in group_keys:
            target = aliases.get(node.name.lower())
            if target is not None:
                return target.copy()
        return node

    return _transform_outside_aggregates(condition.copy(), substitute)


def _transform_outside_aggregates(node: exp.Expr, function: Callable[[exp.Expr], exp.Expr]) -> exp.Expr:
    """Apply `function` top-down; a replaced node and an aggregate call are not descended into."""
    replaced = function(node)
    if replaced is not node or _is_aggregate_call(node):
        return replaced
    for key, value in list(node.args.items()):
        if isinstance(value, exp.Expr):
            node.set(key, _transform_outside_aggregates(value, function))
        elif isinstance(value, list):
            node.set(key, [
                _transform_outside_aggregates(v, function) if isinstance(v, exp.Expr) else v for v in value
            ])
    return node


def _rewrite_over_state(
    node: exp.Expr, group_keys: list[str], arguments: list[exp.Expr], calls: list[AggregateCall],
    call_keys: list[tuple[str, int | None]], context: str,
) -> exp.Expr:
    """Replace GROUP BY keys by `__g<i>` and aggregate calls by `__v<k>`; refuse any other column."""

    def replace(current: exp.Expr) -> exp.Expr:
        key = _canonical(current)
        if key in group_keys:
            return exp.column(f"__g{group_keys.index(key)}")
        if _is_aggregate_call(current):
            function, argument = _classify_call(current)
            index = None
            if argument is not None:
                argument_key = _canonical(argument)
                known = [_canonical(arg) for arg in arguments]
                if argument_key not in known:
                    arguments.append(argument)
                    known.append(argument_key)
                index = known.index(argument_key)
            if (function, index) not in call_keys:
                call_keys.append((function, index))
                calls.append(AggregateCall(function, index, current.sql(dialect="spark")))
            return exp.column(f"__v{call_keys.index((function, index))}")
        if isinstance(current, exp.Column):
            raise UnsupportedQueryError(
                f"column {current.sql(dialect='spark')} in {context} is neither a GROUP BY key nor inside "
                f"a supported aggregate ({_SUPPORTED}); group by it or aggregate it."
            )
        return current

    return _transform_outside_aggregates(node.copy(), replace)


def _classify_call(call: exp.Expr) -> tuple[str, exp.Expr | None]:
    """(function, argument) of a supported aggregate call; anything else is refused by name."""
    sql = call.sql(dialect="spark")
    if isinstance(call, exp.Filter):
        raise UnsupportedQueryError(
            f"aggregate FILTER clauses ({sql}) are not supported; use e.g. SUM(IF(cond, x, NULL)) instead."
        )
    if isinstance(call, exp.Count):
        if call.expressions:
            raise UnsupportedQueryError(f"COUNT with several arguments ({sql}) is not supported.")
        target = call.this
        if isinstance(target, exp.Star):
            return COUNT_STAR, None
        if isinstance(target, exp.Distinct):
            if len(target.expressions) != 1:
                raise UnsupportedQueryError(f"COUNT(DISTINCT ...) of several columns ({sql}) is not supported.")
            return COUNT_DISTINCT, _plain_argument(target.expressions[0], sql)
        return COUNT, _plain_argument(target, sql)
    simple = {exp.Sum: SUM, exp.Avg: AVG, exp.Min: MIN, exp.Max: MAX}
    for cls, function in simple.items():
        if type(call) is cls:
            if call.args.get("expressions"):
                raise UnsupportedQueryError(f"{function.upper()} with several arguments ({sql}) is not supported.")
            if isinstance(call.this, exp.Distinct):
                raise UnsupportedQueryError(
                    f"{function.upper()}(DISTINCT ...) ({sql}) is not supported; only COUNT(DISTINCT x) is."
                )
            return function, _plain_argument(call.this, sql)
    raise UnsupportedQueryError(
        f"aggregate function {sql} is not supported: only {_SUPPORTED} can be maintained incrementally."
    )


def _plain_argument(argument: exp.Expr, sql: str) -> exp.Expr:
    for node in argument.walk():
        if _is_aggregate_call(node):
            raise UnsupportedQueryError(
                f"nested aggregate {sql} is not supported: an aggregate's argument must be a row expression."
            )
    return argument
