"""The Spark SQL texts that build and maintain an aggregate's per-group state.

Pure string generation from an `AggregateQuery`: no Spark here, so every statement can
be read (and printed) on its own. The state has one row per group with

- `__g<i>`: the GROUP BY key values,
- `__rows`: the group's row count (rows passing WHERE); the group exists while it is > 0,
- per aggregate argument j, only what its functions need: `__n<j>` (non-NULL count, for
  COUNT(x), SUM, AVG), `__s<j>` (SUM of the non-NULL values, NULL when there are none),
  `__min<j>`, `__max<j>`, `__d<j>` (distinct non-NULL count).

Statements read `source` (the upstream's rows, or its signed change rows carrying
`__sign` = +1/-1) or the temporary views named by their callers. Group keys are always
compared with `<=>`, so a NULL key is one group, as in GROUP BY.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping, Sequence

import sqlglot
from sqlglot import exp

from airflow_backfill.engine.planning.aggregate_query import (
    AVG,
    COUNT,
    COUNT_DISTINCT,
    COUNT_STAR,
    MAX,
    MIN,
    SUM,
    AggregateQuery,
)

ROWS = "__rows"
SIGN = "__sign"
EXISTED = "__existed"
"""New-state flag: the group had state before the change (so a zero count deletes it)."""
OLD = "__old"
"""Prefix of the old state's columns carried by new-state rows."""
RECOMPUTE = "__recompute"
"""New-state flag: a MIN, MAX or COUNT(DISTINCT) of the group must be read from the upstream."""


def key_columns(aggregate: AggregateQuery) -> list[str]:
    """The state's key columns `__g<i>`."""
    return [f"__g{i}" for i in range(len(aggregate.group_by))]


def _state_parts(aggregate: AggregateQuery) -> list[tuple[str, str, int]]:
    """(column, kind, argument) of each per-argument state column, in table order."""
    parts: list[tuple[str, str, int]] = []
    for j in range(len(aggregate.arguments)):
        functions = aggregate.functions_of(j)
        if functions & {COUNT, SUM, AVG}:
            parts.append((f"__n{j}", "n", j))
        if functions & {SUM, AVG}:
            parts.append((f"__s{j}", "s", j))
        if MIN in functions:
            parts.append((f"__min{j}", MIN, j))
        if MAX in functions:
            parts.append((f"__max{j}", MAX, j))
        if COUNT_DISTINCT in functions:
            parts.append((f"__d{j}", COUNT_DISTINCT, j))
    return parts


def state_value_columns(aggregate: AggregateQuery) -> list[str]:
    """The state's non-key columns, in table order."""
    return [ROWS, *(column for column, _, _ in _state_parts(aggregate))]


def _keys(aggregate: AggregateQuery, alias: str = "") -> str:
    prefix = f"{alias}." if alias else ""
    return ", ".join(f"{prefix}{column}" for column in key_columns(aggregate))


def _same_group(aggregate: AggregateQuery, left: str, right: str) -> str:
    return " AND ".join(f"{left}.{c} <=> {right}.{c}" for c in key_columns(aggregate))


def row_sql(aggregate: AggregateQuery, *, signed: bool = False, relation: str = "source") -> str:
    """One row per row of `relation` (the upstream's rows, or its signed change rows)
    passing WHERE: its group keys and aggregate arguments."""
    columns = [f"{expr} AS __g{i}" for i, expr in enumerate(aggregate.group_by)]
    columns += [f"{expr} AS __x{j}" for j, expr in enumerate(aggregate.arguments)]
    if signed:
        columns.append(SIGN)
    where = f" WHERE {aggregate.where}" if aggregate.where else ""
    return f"SELECT {', '.join(columns)} FROM {relation}{where}"


def plain_group_columns(aggregate: AggregateQuery) -> list[str] | None:
    """The upstream column each GROUP BY key is, when every key is a plain column (no
    expression, no struct field); None otherwise."""
    columns = [_plain_column(expression) for expression in aggregate.group_by]
    plain = [column for column in columns if column is not None]
    return plain if len(plain) == len(columns) else None


def recomputed_parts(aggregate: AggregateQuery) -> list[tuple[str, str, int]]:
    """(state column, kind, argument) of each MIN, MAX and COUNT(DISTINCT) state column."""
    return [part for part in _state_parts(aggregate) if part[1] in (MIN, MAX, COUNT_DISTINCT)]


def plain_argument_columns(aggregate: AggregateQuery) -> dict[int, str] | None:
    """The upstream column each recomputed argument is (MIN, MAX, COUNT(DISTINCT) of a
    plain column), by argument index; None when one is an expression."""
    columns = {j: _plain_column(aggregate.arguments[j]) for _, _, j in recomputed_parts(aggregate)}
    plain = {j: column for j, column in columns.items() if column is not None}
    return plain if len(plain) == len(columns) else None


def _plain_column(expression: str) -> str | None:
    """The column `expression` is, when it is a plain column (no expression, no struct field)."""
    tree = sqlglot.parse_one(expression, read="spark")
    return tree.name if isinstance(tree, exp.Column) and not tree.table else None


def row_columns(aggregate: AggregateQuery) -> frozenset[str]:
    """Lower-cased names the row-level parts (WHERE, GROUP BY keys, arguments) refer to,
    as a column or as the struct a field is read from: change rows need no other column."""
    tree = sqlglot.parse_one(row_sql(aggregate), read="spark")
    return frozenset(part.name.lower() for column in tree.find_all(exp.Column) for part in column.parts)


def state_sql(aggregate: AggregateQuery, *, partial: bool = False) -> str:
    """The state of every group of `source`.

    `partial`: the state of one snapshot chunk, combinable with `combine_sql`; a
    COUNT(DISTINCT) keeps the set of values there, since counts of sets do not add up.
    """
    distinct = "collect_set(__x{j})" if partial else "COUNT(DISTINCT __x{j})"
    templates = {"n": "COUNT(__x{j})", "s": "SUM(__x{j})", MIN: "MIN(__x{j})", MAX: "MAX(__x{j})",
                 COUNT_DISTINCT: distinct}
    columns = [f"COUNT(*) AS {ROWS}"]
    columns += [f"{templates[kind].format(j=j)} AS {column}" for column, kind, j in _state_parts(aggregate)]
    keys = _keys(aggregate)
    return f"SELECT {keys}, {', '.join(columns)} FROM ({row_sql(aggregate)}) r GROUP BY {keys}"


def combine_sql(aggregate: AggregateQuery, partials_view: str) -> str:
    """The state of every group from the partial states of all snapshot chunks."""
    templates = {"n": "SUM({c})", "s": "SUM({c})", MIN: "MIN({c})", MAX: "MAX({c})",
                 COUNT_DISTINCT: "CAST(size(array_distinct(flatten(collect_list({c})))) AS BIGINT)"}
    columns = [f"SUM({ROWS}) AS {ROWS}"]
    columns += [f"{templates[kind].format(c=column)} AS {column}" for column, kind, _ in _state_parts(aggregate)]
    keys = _keys(aggregate)
    return f"SELECT {keys}, {', '.join(columns)} FROM {partials_view} GROUP BY {keys}"


def delta_parts(aggregate: AggregateQuery, widened: Collection[int] = ()) -> list[tuple[str, str, str]]:
    """(column, per-row term, how the terms of a group combine: sum, min or max) of each
    column of a range's delta, in table order. The terms read `row_sql(signed=True)`.

    Counts and sums are signed sums. A removed value is negated, in BIGINT for the
    arguments in `widened` (the narrow integers: SUM gives BIGINT, and negating the
    smallest value of their own type overflows). For MIN/MAX the extreme of the added
    values (`_ins`) and of the removed values (`_del`) tell whether the old extreme
    survives.
    """
    parts = [(ROWS, SIGN, "sum")]
    for j in range(len(aggregate.arguments)):
        functions = aggregate.functions_of(j)
        x = f"__x{j}"
        if functions & {COUNT, SUM, AVG}:
            parts.append((f"__n{j}", f"IF({x} IS NULL, 0, {SIGN})", "sum"))
        if functions & {SUM, AVG}:
            value = f"CAST({x} AS BIGINT)" if j in widened else x
            parts.append((f"__s{j}", f"IF({SIGN} > 0, {value}, -{value})", "sum"))
        for function in (MIN, MAX):
            if function in functions:
                parts.append((f"__{function}{j}_ins", f"IF({SIGN} > 0, {x}, NULL)", function))
                parts.append((f"__{function}{j}_del", f"IF({SIGN} < 0, {x}, NULL)", function))
    return parts


def delta_sql(aggregate: AggregateQuery, changes_view: str, widened: Collection[int] = ()) -> str:
    """Per group touched by the signed change rows in `changes_view`: what the changes add
    (`widened`: as `delta_parts`)."""
    columns = [f"{combine.upper()}({term}) AS {column}"
               for column, term, combine in delta_parts(aggregate, widened)]
    keys = _keys(aggregate)
    rows = row_sql(aggregate, signed=True, relation=changes_view)
    return f"SELECT {keys}, {', '.join(columns)} FROM ({rows}) r GROUP BY {keys}"


def delta_terms_sql(aggregate: AggregateQuery, changes_view: str, sum_types: Mapping[str, str],
                    widened: Collection[int] = ()) -> str:
    """`delta_sql` before grouping: each change row's keys and terms, for the caller to
    combine per group. A summed term is cast to `sum_types[column]`, the type SUM gives
    it, so the combined values have the types Spark's aggregate would give them."""
    columns = [
        f"CAST({term} AS {sum_types[column]}) AS {column}" if combine == "sum" else f"{term} AS {column}"
        for column, term, combine in delta_parts(aggregate, widened)
    ]
    rows = row_sql(aggregate, signed=True, relation=changes_view)
    return f"SELECT {_keys(aggregate)}, {', '.join(columns)} FROM ({rows}) r"


def narrow_integers(argument_types: Sequence[str]) -> frozenset[int]:
    """The arguments (by index) whose Spark types (`simpleString`) are integers narrower than
    BIGINT: `delta_parts` negates them in BIGINT."""
    return frozenset(j for j, kind in enumerate(argument_types) if kind in ("tinyint", "smallint", "int"))


def _extreme_lost(function: str, j: int) -> str:
    """True when a removed value may have been the group's MIN (MAX): it must be recomputed."""
    compare = "<=" if function == MIN else ">="
    removed, old = f"__{function}{j}_del", f"{OLD}__{function}{j}"
    return f"({removed} IS NOT NULL AND ({old} IS NULL OR {removed} {compare} {old}))"


def new_state_sql(aggregate: AggregateQuery, touched_view: str) -> str:
    """The new state of every touched group: old state (if any) plus the delta.

    `touched_view` has one row per group of `delta_sql` with that group's old state
    alongside, its columns prefixed `__old` (all NULL for a group without state).
    MIN/MAX keep `least`/`greatest` of the old extreme and the added values unless a
    removed value may have been the extreme; COUNT(DISTINCT) is always recomputed. Those
    groups get `__recompute` and a NULL placeholder, filled by `with_recomputed_sql`.
    The old state is carried along, for `changes_sql`.
    """
    rows = f"COALESCE({OLD}{ROWS}, 0) + {ROWS}"
    columns = [f"{rows} AS {ROWS}"]
    recompute: list[str] = []
    for j in range(len(aggregate.arguments)):
        functions = aggregate.functions_of(j)
        count = f"COALESCE({OLD}__n{j}, 0) + __n{j}"
        if functions & {COUNT, SUM, AVG}:
            columns.append(f"{count} AS __n{j}")
        if functions & {SUM, AVG}:
            columns.append(f"IF({count} > 0, COALESCE({OLD}__s{j}, 0) + COALESCE(__s{j}, 0), NULL) AS __s{j}")
        for function, combine in ((MIN, "least"), (MAX, "greatest")):
            if function in functions:
                lost = _extreme_lost(function, j)
                recompute.append(lost)
                columns.append(
                    f"IF({lost}, NULL, {combine}({OLD}__{function}{j}, __{function}{j}_ins)) AS __{function}{j}"
                )
        if COUNT_DISTINCT in functions:
            recompute.append("true")
            columns.append(f"CAST(NULL AS BIGINT) AS __d{j}")
    needs = " OR ".join(recompute) if recompute else "false"
    columns.append(f"{OLD}{ROWS} IS NOT NULL AS {EXISTED}")
    columns.append(f"({rows} > 0 AND ({needs})) AS {RECOMPUTE}")
    columns += old_columns(aggregate)
    return f"SELECT {_keys(aggregate)}, {', '.join(columns)} FROM {touched_view}"


def recomputed_columns(aggregate: AggregateQuery) -> list[str]:
    """The state columns that are recomputed from the upstream rather than maintained."""
    return [column for column, _, _ in recomputed_parts(aggregate)]


def recompute_sql(aggregate: AggregateQuery, keys_view: str) -> str:
    """MIN, MAX and COUNT(DISTINCT) of the groups in `keys_view`, from the upstream `source`.

    The upstream rows are semi-joined with the (broadcast) keys before grouping, so only
    the touched groups are aggregated.
    """
    templates = {MIN: "MIN(r.__x{j})", MAX: "MAX(r.__x{j})", COUNT_DISTINCT: "COUNT(DISTINCT r.__x{j})"}
    columns = [
        f"{templates[kind].format(j=j)} AS {column}"
        for column, kind, j in _state_parts(aggregate) if kind in templates
    ]
    return (
        f"SELECT /*+ BROADCAST(k) */ {_keys(aggregate, 'r')}, {', '.join(columns)} "
        f"FROM ({row_sql(aggregate)}) r LEFT SEMI JOIN {keys_view} k ON {_same_group(aggregate, 'r', 'k')} "
        f"GROUP BY {_keys(aggregate, 'r')}"
    )


def with_recomputed_sql(aggregate: AggregateQuery, new_view: str, recomputed_view: str) -> str:
    """The new state with the recomputed columns taken from `recomputed_view` where flagged."""
    recomputed = set(recomputed_columns(aggregate))
    columns = [
        f"IF(n.{RECOMPUTE}, r.{c}, n.{c}) AS {c}" if c in recomputed else f"n.{c}"
        for c in state_value_columns(aggregate)
    ]
    columns += [f"n.{EXISTED}", f"n.{RECOMPUTE}", *(f"n.{OLD}{c}" for c in state_value_columns(aggregate))]
    return (
        f"SELECT {_keys(aggregate, 'n')}, {', '.join(columns)} "
        f"FROM {new_view} n LEFT JOIN {recomputed_view} r ON {_same_group(aggregate, 'n', 'r')}"
    )


def old_columns(aggregate: AggregateQuery) -> list[str]:
    """The old state's columns carried by the new state rows."""
    return [f"{OLD}{c}" for c in state_value_columns(aggregate)]


def _value(aggregate: AggregateQuery, k: int, prefix: str) -> str:
    call = aggregate.calls[k]
    j = call.argument
    return {
        COUNT_STAR: f"{prefix}{ROWS}",
        COUNT: f"{prefix}__n{j}",
        SUM: f"{prefix}__s{j}",
        AVG: f"try_divide({prefix}__s{j}, {prefix}__n{j})",
        MIN: f"{prefix}__min{j}",
        MAX: f"{prefix}__max{j}",
        COUNT_DISTINCT: f"{prefix}__d{j}",
    }[call.function]


def probe_sql(aggregate: AggregateQuery) -> str:
    """Each aggregate call over `source`, only analysed by Spark to learn its result type."""
    functions = {COUNT_STAR: "COUNT(*)", COUNT: "COUNT({})", SUM: "SUM({})", AVG: "AVG({})",
                 MIN: "MIN({})", MAX: "MAX({})", COUNT_DISTINCT: "COUNT(DISTINCT {})"}
    columns = [
        functions[call.function].format(f"__x{call.argument}") + f" AS __v{k}"
        for k, call in enumerate(aggregate.calls)
    ]
    return f"SELECT {', '.join(columns) or 'COUNT(*) AS __v'} FROM ({row_sql(aggregate)}) r"


def quote(name: str) -> str:
    """A Spark SQL identifier for any column name."""
    return "`" + name.replace("`", "``") + "`"


def cast_expressions(columns: Sequence[tuple[str, str]], keep: Sequence[str] = ()) -> list[str]:
    """Select-list items casting each (name, Spark SQL type) column to its type, then the
    `keep` columns as they are."""
    casts = [f"CAST({quote(name)} AS {type_}) AS {quote(name)}" for name, type_ in columns]
    return [*casts, *(quote(name) for name in keep)]


@functools.lru_cache(maxsize=256)
def _over_state(expression: str, aggregate: AggregateQuery, value_types: tuple[str, ...], prefix: str) -> str:
    """An output or HAVING expression with each `__v<k>` replaced by its value from the
    state columns named `<prefix>...` (cast to the aggregate's own result type).

    Cached: every round of a job rewrites the same expressions.
    """
    def replace(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column) and not node.table and node.name.startswith("__v"):
            k = int(node.name[3:])
            value = f"CAST({_value(aggregate, k, prefix)} AS {value_types[k]})"
            return exp.Paren(this=sqlglot.parse_one(value, read="spark"))
        return node

    return sqlglot.parse_one(expression, read="spark").transform(replace).sql(dialect="spark")


def _shown(aggregate: AggregateQuery, value_types: list[str], prefix: str) -> str:
    """True for a state row the MV shows: the group has rows and passes HAVING."""
    having = f" AND COALESCE({_over_state(aggregate.having, aggregate, tuple(value_types), prefix)}, false)" \
        if aggregate.having else ""
    return f"(COALESCE({prefix}{ROWS}, 0) > 0{having})"


def _outputs(aggregate: AggregateQuery, value_types: list[str], mv_types: list[str], prefix: str) -> list[str]:
    return [
        f"CAST({_over_state(projection, aggregate, tuple(value_types), prefix)} AS {mv_type})"
        for projection, mv_type in zip(aggregate.projections, mv_types, strict=True)
    ]


def visible_sql(
    aggregate: AggregateQuery, state_view: str, value_types: list[str], names: list[str], mv_types: list[str]
) -> str:
    """The MV's rows from the state: live groups passing HAVING, projected as the query says.

    `value_types` are the Spark types of the aggregate calls (from `probe_sql`), so each
    value has exactly the type the query's aggregate has; `names` and `mv_types` the MV's
    columns.
    """
    outputs = _outputs(aggregate, value_types, mv_types, "")
    selected = ", ".join(f"{output} AS {quote(name)}" for output, name in zip(outputs, names, strict=True))
    return f"SELECT {selected} FROM {state_view} WHERE {_shown(aggregate, value_types, '')}"


MV_CHANGE = "__mv_change"
"""Changes column: 'upsert' (the group's MV row is new or changed), 'delete', or NULL."""


def mv_column(i: int) -> str:
    """The name of MV column i in `changes_sql` (MV names may clash with state columns)."""
    return f"__mv{i}"


def changes_sql(aggregate: AggregateQuery, new_relation: str, value_types: list[str], mv_types: list[str]) -> str:
    """Per touched group: its new state, its MV row computed from the new state, and
    whether that row is an upsert, a delete or no MV change (from the old state's row).

    Old and new state are in the same row, so this is one projection: no join.
    """
    new_outputs = _outputs(aggregate, value_types, mv_types, "")
    old_outputs = _outputs(aggregate, value_types, mv_types, OLD)
    shown_new, shown_old = _shown(aggregate, value_types, ""), _shown(aggregate, value_types, OLD)
    same = " AND ".join(f"({new} <=> {old})" for new, old in zip(new_outputs, old_outputs, strict=True))
    change = (
        f"CASE WHEN {shown_new} AND NOT ({shown_old} AND {same}) THEN 'upsert' "
        f"WHEN {shown_old} AND NOT {shown_new} THEN 'delete' END"
    )
    columns = [*key_columns(aggregate), *state_value_columns(aggregate), EXISTED]
    columns += [f"{output} AS {mv_column(i)}" for i, output in enumerate(new_outputs)]
    return f"SELECT {', '.join(columns)}, {change} AS {MV_CHANGE} FROM {new_relation}"
