"""Plan an MV query over several upstreams (a join): its join tree, its MV key, and the
same query over one flat relation, which the rest of the engine already maintains.

A supported join reads each of the job's `sources` once, by name (optionally with an
alias), and joins them with INNER or LEFT [OUTER] joins whose ON conditions are
equalities between a column of the joined table and a column of one earlier table; a
comma or CROSS join counts as an inner join when WHERE equates the table's columns with
one earlier table's. The tables then form a tree (each joined table hangs off one
earlier table), which is what the delta rule of a round walks (`engine/joins/`).

The planner rewrites the query over `source`, one relation whose columns are the
upstreams' columns named `<upstream>__<column>` (`flat_column`): `FROM` and the joins go,
every column reference is resolved to its upstream (unqualified names must be unique
among the upstreams' columns). That flat query is planned by `plan_query` as a stateless
query or a grouped aggregate, so projections, WHERE, GROUP BY and HAVING keep their
meaning and their checks.

The MV key of a stateless join is derived from the upstreams' keys: a table whose whole
key is equated with columns of the other tables (a dimension joined by its key, or the
NULL-supplying side of a LEFT JOIN joined by its key) has at most one row per row of
them, so its key is left out; the keys of the tables left make the MV key, and the
query must select each of their columns (or, through an INNER JOIN's equality, a column
equal to it). See docs/joins.md.

Planning needs the upstreams' column names (from their Delta logs, no Spark), because a
column written without its table must be found in exactly one upstream.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from sqlglot import exp

from airflow_backfill.engine.planning.query import (
    SOURCE_TABLE,
    QueryPlan,
    parse_single_select,
    plan_query,
    refuse_unmaintained_clauses,
    refuse_unmaintained_expressions,
)
from airflow_backfill.exceptions import UnsupportedQueryError

T = TypeVar("T")

INNER = "inner"
LEFT = "left"

_SUPPORTED = (
    "INNER and LEFT [OUTER] JOINs whose ON conditions equate a column of the joined table with a column "
    "of one earlier table (AND of equalities)"
)


def flat_column(upstream: str, column: str) -> str:
    """The name of an upstream's column in the flat relation the rounds build."""
    return f"{upstream}__{column}"


@dataclass(frozen=True)
class JoinedTable:
    """One upstream in the join tree."""

    name: str
    """The upstream's name in the job's `sources`."""
    alias: str
    """How the query refers to it (its alias, or its name)."""
    parent: int | None
    """The index of the earlier table its ON condition links it to (None for the first)."""
    kind: str | None
    """`inner` or `left` (how it joins its parent); None for the first table."""
    on: tuple[tuple[str, str], ...]
    """(parent's column, own column) of each equality of its join condition."""
    primary_key: tuple[str, ...]
    columns: tuple[str, ...]
    """The upstream columns a round reads: the ones the query refers to, the join columns
    (the join's rows depend on nothing else, so changes are netted over these) and the
    key (a round tells changed rows apart by it, `joins/leave_arrive.py`)."""
    padded: bool
    """In a LEFT-joined subtree: its columns are NULL in rows its parent kept unmatched."""


@dataclass(frozen=True)
class JoinPlan:
    """What the engine derived from a join MV query."""

    query: str
    tables: tuple[JoinedTable, ...]
    """In FROM order; `tables[0]` is the root of the join tree."""
    flat: QueryPlan
    """The query over the flat relation `source` (columns named by `flat_column`)."""
    key_tables: tuple[int, ...] = field(default=())
    """The tables whose keys make a stateless MV's key (empty for an aggregate)."""

    @property
    def kind(self) -> str:
        return self.flat.kind

    @property
    def mv_key(self) -> tuple[str, ...]:
        return self.flat.mv_key

    @property
    def null_safe_key(self) -> bool:
        """Some MV key column may be NULL (a padded table's key, or an aggregate's group)."""
        return self.flat.aggregate is not None or any(self.tables[i].padded for i in self.key_tables)

    def index(self, name: str) -> int:
        return next(i for i, table in enumerate(self.tables) if table.name == name)

    def children(self, index: int) -> list[int]:
        return [i for i, table in enumerate(self.tables) if table.parent == index]

    def neighbours(self, index: int) -> list[int]:
        parent = self.tables[index].parent
        return ([] if parent is None else [parent]) + self.children(index)

    def flat_columns(self, index: int) -> list[str]:
        table = self.tables[index]
        return [flat_column(table.name, column) for column in table.columns]

    def core(self) -> list[int]:
        """Tables present in every output row (never NULL-padded): the root and the tables
        INNER-joined to it. Each output row holds exactly one row of each of them."""
        return [i for i, table in enumerate(self.tables) if not table.padded]


def plan_join(query: str, upstreams: Sequence[tuple[str, Sequence[str]]],
              columns: Mapping[str, Sequence[str]]) -> JoinPlan:
    """Parse, check and key a join MV query; raise UnsupportedQueryError naming the problem.

    `upstreams`: (name, primary key) of each of the job's sources; `columns`: each
    upstream's column names (its Delta schema). Cached: every round plans the same query.
    """
    return _plan_join(
        query, tuple((name, tuple(key)) for name, key in upstreams),
        tuple((name, tuple(names)) for name, names in columns.items()),
    )


@functools.lru_cache(maxsize=64)
def _plan_join(query: str, upstreams: tuple[tuple[str, tuple[str, ...]], ...],
               columns: tuple[tuple[str, tuple[str, ...]], ...]) -> JoinPlan:
    select = parse_single_select(query)
    _refuse_outside_the_join(select)
    keys = dict(upstreams)
    resolver = _Resolver(_aliases(select, [name for name, _ in upstreams]), dict(columns), select)
    where = select.args.get("where")
    conjuncts = _conjuncts(where.this) if where is not None else []
    tree = _join_tree(select, resolver, conjuncts)
    flat = _flat_select(select, resolver, [c for c in conjuncts if id(c) not in tree.moved])
    read = resolver.read_columns()  # join conditions included
    tables = []
    for index, (name, alias) in enumerate(resolver.tables):
        key = tuple(resolver.key_column(name, column, keys[name]) for column in keys[name])
        tables.append(JoinedTable(
            name=name, alias=alias, parent=tree.parent.get(index), kind=tree.kind.get(index),
            on=tree.on.get(index, ()), primary_key=key,
            columns=tuple(c for c in resolver.columns[name] if c in read.get(index, set()) or c in key),
            padded=tree.padded(index),
        ))
    return _keyed_plan(query, tuple(tables), flat.sql(dialect="spark"))


@functools.lru_cache(maxsize=64)
def check_join_query(query: str, names: tuple[str, ...]) -> None:
    """What can be refused of a join's query without its upstreams' schemas: the clauses,
    expressions and join kinds no MV can keep, and tables that are not the job's sources.
    Run when the job loads; `plan_join` checks the columns and keys when a task runs."""
    select = parse_single_select(query)
    _refuse_outside_the_join(select)
    tables = _aliases(select, list(names))
    for join, (_, alias) in zip(select.args.get("joins") or [], tables[1:], strict=True):
        _join_kind(join, alias)
    refuse_unmaintained_clauses(select)
    refuse_unmaintained_expressions(select)


def _refuse_outside_the_join(select: exp.Select) -> None:
    """What a join query may not contain, checked before its columns are resolved."""
    if select.args.get("with_") is not None or select.args.get("with") is not None:
        raise UnsupportedQueryError("WITH (common table expressions) is not supported; join the sources directly.")
    for item in select.expressions:
        if isinstance(item, exp.Star) or (isinstance(item, exp.Column) and isinstance(item.this, exp.Star)):
            raise UnsupportedQueryError(
                "SELECT * (or t.*) is not supported over a join: the upstreams' columns may share names. "
                "List the columns the MV keeps."
            )
    for node in select.walk():
        if node is not select and isinstance(node, exp.Select | exp.Subquery | exp.Exists):
            raise UnsupportedQueryError("subqueries are not supported; join the sources directly.")
        if isinstance(node, exp.Lateral):
            raise UnsupportedQueryError("LATERAL VIEW is not supported over a join.")


def _aliases(select: exp.Select, names: list[str]) -> list[tuple[str, str]]:
    """(upstream name, alias) of each table the query reads, in FROM order."""
    from_ = select.args.get("from_") or select.args.get("from")
    if from_ is None:
        raise UnsupportedQueryError(f"the query must read FROM the job's sources ({', '.join(names)}).")
    relations = [from_.this, *(join.this for join in select.args.get("joins") or [])]
    known = {name.lower(): name for name in names}
    tables: list[tuple[str, str]] = []
    for relation in relations:
        if not isinstance(relation, exp.Table) or relation.db:
            raise UnsupportedQueryError(
                f"the query must read the job's sources by name ({', '.join(names)}), got "
                f"{relation.sql(dialect='spark')}."
            )
        name = known.get(relation.name.lower())
        if name is None:
            raise UnsupportedQueryError(
                f"the query reads `{relation.name}`, which is not one of the job's sources "
                f"({', '.join(names)}); add it to `sources` or fix the name."
            )
        if any(name == seen for seen, _ in tables):
            raise UnsupportedQueryError(
                f"the query reads `{name}` twice: joining an upstream with itself is not supported."
            )
        tables.append((name, relation.alias or relation.name))
    missing = [name for name in names if name not in {seen for seen, _ in tables}]
    if missing:
        raise UnsupportedQueryError(
            f"the query does not read the source(s) {', '.join(missing)}; join them or remove them from `sources`."
        )
    aliases = [alias.lower() for _, alias in tables]
    repeated = sorted({alias for alias in aliases if aliases.count(alias) > 1})
    if repeated:
        raise UnsupportedQueryError(f"the alias {repeated[0]} names two tables; give each table its own alias.")
    return tables


class _Resolver:
    """Resolves column references to (table index, actual column name)."""

    def __init__(self, tables: list[tuple[str, str]], columns: dict[str, tuple[str, ...]],
                 select: exp.Select) -> None:
        self.tables = tables
        self.columns = {name: columns.get(name, ()) for name, _ in tables}
        self._by_alias = {alias.lower(): index for index, (_, alias) in enumerate(tables)}
        self._output_aliases = {item.alias.lower() for item in select.expressions if isinstance(item, exp.Alias)}
        self._read: dict[int, set[str]] = {}

    def actual(self, name: str, column: str, what: str) -> str:
        found = next((c for c in self.columns[name] if c.lower() == column.lower()), None)
        if found is None:
            raise UnsupportedQueryError(
                f"{what} {column} is not a column of upstream {name} (its columns: "
                f"{', '.join(self.columns[name])})."
            )
        return found

    def key_column(self, name: str, column: str, key: Sequence[str]) -> str:
        """A primary-key column as the upstream spells it, refused when spelled in another
        case (as a one-upstream job's key is): a query's names match whatever their case,
        a job's key columns are written exactly as the table holds them."""
        found = self.actual(name, column, "primary_key")
        if found != column:
            fixed = ", ".join(self.actual(name, c, "primary_key") for c in key)
            raise UnsupportedQueryError(
                f"primary_key {column!r} of source {name}: the upstream spells this column {found!r}; write it "
                f"so in sources.{name}.primary_key ([{fixed}])."
            )
        return found

    def resolve(self, column: exp.Column) -> tuple[int, str] | None:
        """The column's table and actual name; None for a SELECT alias (GROUP BY, HAVING)."""
        written = column.sql(dialect="spark")
        if column.args.get("db") is not None:
            raise UnsupportedQueryError(f"column {written}: read struct fields as table.column.field is not "
                                        "supported over a join; select the struct column.")
        qualifier = column.table
        if qualifier:
            index = self._by_alias.get(qualifier.lower())
            if index is None:
                raise UnsupportedQueryError(
                    f"column {written} names the table `{qualifier}`, which the query does not read "
                    f"(its tables: {', '.join(alias for _, alias in self.tables)})."
                )
            name = self.tables[index][0]
            return self._note(index, self.actual(name, column.name, f"column {written}:"))
        holders = [i for i, (name, _) in enumerate(self.tables)
                   if any(c.lower() == column.name.lower() for c in self.columns[name])]
        if len(holders) > 1:
            raise UnsupportedQueryError(
                f"column {written} is ambiguous: upstreams {' and '.join(self.tables[i][0] for i in holders)} "
                f"both have it; qualify it, e.g. {self.tables[holders[0]][1]}.{column.name}."
            )
        if not holders:
            if column.name.lower() in self._output_aliases:
                return None
            listed = "; ".join(f"{name}: {', '.join(self.columns[name])}" for name, _ in self.tables)
            raise UnsupportedQueryError(f"column {written} is in none of the upstreams ({listed}).")
        name = self.tables[holders[0]][0]
        return self._note(holders[0], self.actual(name, column.name, f"column {written}:"))

    def _note(self, index: int, column: str) -> tuple[int, str]:
        self._read.setdefault(index, set()).add(column)
        return index, column

    def read_columns(self) -> dict[int, set[str]]:
        return self._read

    def flat_name(self, index: int, column: str) -> str:
        return flat_column(self.tables[index][0], column)


@dataclass
class _Tree:
    parent: dict[int, int] = field(default_factory=dict)
    kind: dict[int, str] = field(default_factory=dict)
    on: dict[int, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    moved: set[int] = field(default_factory=set)
    """ids of WHERE conjuncts that became join conditions (comma and CROSS joins)."""

    def padded(self, index: int) -> bool:
        while index in self.parent:
            if self.kind[index] == LEFT:
                return True
            index = self.parent[index]
        return False


def _conjuncts(condition: exp.Expr) -> list[exp.Expr]:
    if isinstance(condition, exp.Paren):
        return _conjuncts(condition.this)
    if isinstance(condition, exp.And):
        return [*_conjuncts(condition.this), *_conjuncts(condition.expression)]
    return [condition]


def _join_kind(join: exp.Join, alias: str) -> str:
    """`inner`, `left` or `cross` (to be linked by WHERE); anything else is refused by name."""
    side, kind, method = join.side.upper(), join.kind.upper(), (join.method or "").upper()
    written = f"JOIN {alias}"
    if method == "NATURAL":
        raise UnsupportedQueryError(f"NATURAL {written} is not supported; write JOIN {alias} ON a.x = {alias}.x.")
    if join.args.get("using"):
        raise UnsupportedQueryError(f"{written} USING (...) is not supported; write ON a.x = {alias}.x instead.")
    if kind in ("SEMI", "ANTI"):
        raise UnsupportedQueryError(f"{side} {kind} {written} is not supported; {_SUPPORTED} are.")
    if side == "RIGHT":
        raise UnsupportedQueryError(
            f"RIGHT {written} is not supported: swap the two tables and write LEFT JOIN (the preserved "
            "table first)."
        )
    if side == "FULL":
        raise UnsupportedQueryError(
            f"FULL OUTER {written} is not supported: a row of either side may be NULL-padded, so no "
            f"upstream's key identifies the MV's rows. Only {_SUPPORTED} can be maintained."
        )
    if kind == "CROSS" or (not side and not kind and join.args.get("on") is None):
        return "cross"
    if side == "LEFT":
        return LEFT
    if side or kind not in ("", "INNER", "OUTER"):
        raise UnsupportedQueryError(f"{side} {kind} {written} is not supported; {_SUPPORTED} are.")
    return INNER


def _join_tree(select: exp.Select, resolver: _Resolver, where: list[exp.Expr]) -> _Tree:
    tree = _Tree()
    for index, join in enumerate(select.args.get("joins") or [], start=1):
        alias = resolver.tables[index][1]
        kind = _join_kind(join, alias)
        if kind == "cross":
            conditions = _linking_conjuncts(where, index, resolver)
            if not conditions:
                raise UnsupportedQueryError(
                    f"the join of {alias} has no equality with an earlier table (a CROSS JOIN): every row "
                    f"would pair with every row. Write JOIN {alias} ON <earlier>.x = {alias}.y."
                )
            tree.moved |= {id(c) for c in conditions}
            kind = INNER
        else:
            on = join.args.get("on")
            conditions = _conjuncts(on) if on is not None else []
        pairs = [_linking_pair(c, index, resolver) for c in conditions]
        for condition, pair in zip(conditions, pairs, strict=True):
            if pair is None:
                raise UnsupportedQueryError(
                    f"the join condition {condition.sql(dialect='spark')} of {alias} is not an equality "
                    f"between a column of {alias} and a column of an earlier table: only {_SUPPORTED} can be "
                    "maintained. Move filters of one table to WHERE."
                )
        parents = sorted({parent for parent, _, _ in pairs if parent is not None})  # type: ignore[misc]
        if not parents:
            raise UnsupportedQueryError(
                f"the join of {alias} has no equality with an earlier table (ON TRUE is a CROSS JOIN); write "
                f"JOIN {alias} ON <earlier>.x = {alias}.y."
            )
        if len(parents) > 1:
            names = " and ".join(resolver.tables[p][1] for p in parents)
            raise UnsupportedQueryError(
                f"the join condition of {alias} links it to {names}: each joined table may be linked to one "
                "earlier table (move the other equality to WHERE)."
            )
        parent = parents[0]
        if kind == INNER and tree.padded(parent):
            raise UnsupportedQueryError(
                f"{alias} is INNER JOINed on the columns of {resolver.tables[parent][1]}, which is LEFT JOINed: "
                f"that drops the rows the LEFT JOIN pads. Write LEFT JOIN {alias}, or JOIN "
                f"{resolver.tables[parent][1]}."
            )
        tree.parent[index], tree.kind[index] = parent, kind
        tree.on[index] = tuple((parent_column, own) for _, parent_column, own in pairs)  # type: ignore[misc]
    return tree


def _linking_conjuncts(where: list[exp.Expr], index: int, resolver: _Resolver) -> list[exp.Expr]:
    """The WHERE equalities that join table `index` (of a comma or CROSS join) to the first
    earlier table WHERE equates it with; equalities with other tables stay filters."""
    pairs = [(c, _linking_pair(c, index, resolver)) for c in where]
    parents = [pair[0] for _, pair in pairs if pair is not None]
    if not parents:
        return []
    return [c for c, pair in pairs if pair is not None and pair[0] == min(parents)]


def _linking_pair(condition: exp.Expr, index: int, resolver: _Resolver) -> tuple[int, str, str] | None:
    """(earlier table, its column, this table's column) when `condition` equates a column of
    table `index` with a column of an earlier table; else None."""
    if not isinstance(condition, exp.EQ):
        return None
    left, right = condition.this, condition.expression
    if not isinstance(left, exp.Column) or not isinstance(right, exp.Column):
        return None
    resolved = [resolver.resolve(left), resolver.resolve(right)]
    if any(side is None for side in resolved):
        return None
    (left_table, left_column), (right_table, right_column) = resolved  # type: ignore[misc]
    if left_table == index and right_table < index:
        return right_table, right_column, left_column
    if right_table == index and left_table < index:
        return left_table, left_column, right_column
    return None


def _flat_select(select: exp.Select, resolver: _Resolver, where: list[exp.Expr]) -> exp.Select:
    """The query over the flat relation `source`: columns renamed, FROM and joins replaced."""

    def rename(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column):
            resolved = resolver.resolve(node)
            if resolved is not None:
                return exp.column(resolver.flat_name(*resolved), quoted=True)
        return node

    flat = select.copy()
    flat.set("joins", None)
    flat.set("from_", exp.From(this=exp.to_table(SOURCE_TABLE)))
    flat.set("where", exp.Where(this=exp.and_(*where)) if where else None)
    items = []
    for item in flat.expressions:
        renamed = item.transform(rename)
        if isinstance(item, exp.Column):  # Spark names an unaliased column as written
            renamed = exp.alias_(renamed, exp.to_identifier(item.name, quoted=item.this.quoted))
        items.append(renamed)
    flat.set("expressions", items)
    for clause in ("where", "group", "having"):
        part = flat.args.get(clause)
        if part is not None:
            flat.set(clause, part.transform(rename))
    return flat


def _keyed_plan(query: str, tables: tuple[JoinedTable, ...], flat_sql: str) -> JoinPlan:
    """Plan the flat query, keyed by the key tables' columns for a stateless join."""
    probe = _readable(tables, lambda: plan_query(flat_sql, ()))  # aggregate or not; refusals by name
    if probe.aggregate is not None:
        if probe.aggregate.needs_recompute:
            raise UnsupportedQueryError(
                "MIN, MAX and COUNT(DISTINCT) over a join are not supported: a round would have to "
                "recompute the join for every group they may have moved. COUNT, SUM and AVG are supported."
            )
        return JoinPlan(query, tables, probe)
    key_tables = _key_tables(tables)
    selected = _selected_columns(flat_sql)
    key: list[str] = []
    for index in key_tables:
        table = tables[index]
        for column in table.primary_key:
            choices = _equal_columns(tables, index, column)
            chosen = next((c for c in choices if c.lower() in selected), None)
            if chosen is None:
                raise UnsupportedQueryError(
                    f"the MV's key is the key of {_key_description(tables, key_tables)}: the query must select "
                    f"{table.alias}.{column} unchanged (optionally renamed), e.g. SELECT {table.alias}.{column}, "
                    "... (see docs/joins.md for how the key is derived)."
                )
            key.append(chosen)
    plan = _readable(tables, lambda: plan_query(flat_sql, tuple(key)))
    return JoinPlan(query, tables, plan, key_tables)


def _key_tables(tables: tuple[JoinedTable, ...]) -> tuple[int, ...]:
    """The smallest set of tables (later ones dropped first) whose keys determine every row."""
    kept = list(range(len(tables)))
    for index in reversed(range(len(tables))):
        trial = [i for i in kept if i != index]
        if trial and _determined(tables, trial) == set(range(len(tables))):
            kept = trial
    return tuple(kept)


def _determined(tables: tuple[JoinedTable, ...], known: list[int]) -> set[int]:
    """The tables whose row is fixed once the rows of `known` are: a table whose whole key
    is equated with columns of a determined table. Across a LEFT JOIN only the padded side
    can be determined that way (a padded row determines nothing)."""
    done = set(known)
    changed = True
    while changed:
        changed = False
        for index, table in enumerate(tables):
            if index in done:
                continue
            equated = {own.lower() for other, own in _equalities(tables, index) if other in done}
            if all(column.lower() in equated for column in table.primary_key):
                done.add(index)
                changed = True
    return done


def _equalities(tables: tuple[JoinedTable, ...], index: int) -> list[tuple[int, str]]:
    """(other table, own column) of each equality that fixes a column of `index` once the
    other table's row is fixed."""
    table = tables[index]
    found = [(table.parent, own) for _, own in table.on] if table.parent is not None else []
    for child, other in enumerate(tables):
        if other.parent == index and other.kind == INNER:
            found += [(child, parent_column) for parent_column, _ in other.on]
    return found  # type: ignore[return-value]


def _equal_columns(tables: tuple[JoinedTable, ...], index: int, column: str) -> list[str]:
    """The flat names of `column` of table `index` and of the columns an INNER JOIN's
    equality makes equal to it in every output row."""
    found = [(index, column)]
    for table_index, table_column in found:
        table = tables[table_index]
        links = []
        if table.parent is not None and table.kind == INNER:
            links += [(table.parent, p) for p, own in table.on if own.lower() == table_column.lower()]
        for child, other in enumerate(tables):
            if other.parent == table_index and other.kind == INNER:
                links += [(child, own) for p, own in other.on if p.lower() == table_column.lower()]
        found += [link for link in links if link not in found]
    return [flat_column(tables[i].name, c) for i, c in found]


def selected_key(plan: JoinPlan, index: int) -> tuple[str, ...] | None:
    """The MV columns that hold table `index`'s key in every MV row (one per key column:
    the column itself or one an INNER JOIN equates with it, selected unchanged), or None
    when the query does not select all of them. Only meaningful without LEFT joins."""
    return _key_among(plan, index, _selected_outputs(plan.flat.query))


def grouped_key(plan: JoinPlan, index: int) -> tuple[int, ...] | None:
    """For an aggregate: the GROUP BY positions that hold table `index`'s key in every row
    (one per key column, as `selected_key`), or None when the grouping does not hold all
    of them. Each group then holds the rows of one row of the table."""
    assert plan.flat.aggregate is not None
    grouped: dict[str, int] = {}
    for position, expression in enumerate(plan.flat.aggregate.group_by):
        parsed: exp.Expr = exp.maybe_parse(expression, dialect="spark")
        if isinstance(parsed, exp.Column):
            grouped.setdefault(parsed.name.lower(), position)
    return _key_among(plan, index, grouped)


def _key_among(plan: JoinPlan, index: int, holders: Mapping[str, T]) -> tuple[T, ...] | None:
    """For each key column of table `index`, what `holders` maps it (or a column equal
    to it) to, by lower-case flat name; None when some key column has no holder."""
    found = []
    for column in plan.tables[index].primary_key:
        equal = (c.lower() for c in _equal_columns(plan.tables, index, column))
        chosen = next((holders[c] for c in equal if c in holders), None)
        if chosen is None:
            return None
        found.append(chosen)
    return tuple(found)


@functools.lru_cache(maxsize=64)
def _selected_outputs(flat_sql: str) -> dict[str, str]:
    """Flat column (lower case) -> the MV column that selects it unchanged."""
    outputs: dict[str, str] = {}
    for item in parse_single_select(flat_sql).expressions:
        inner = item.this if isinstance(item, exp.Alias) else item
        if isinstance(inner, exp.Column):
            outputs.setdefault(inner.name.lower(), item.alias_or_name)
    return outputs


def _selected_columns(flat_sql: str) -> set[str]:
    select = parse_single_select(flat_sql)
    return {
        (item.this if isinstance(item, exp.Alias) else item).name.lower()
        for item in select.expressions if isinstance(item.this if isinstance(item, exp.Alias) else item, exp.Column)
    }


def _key_description(tables: tuple[JoinedTable, ...], key_tables: tuple[int, ...]) -> str:
    return " and ".join(f"{tables[i].alias} ({', '.join(tables[i].primary_key)})" for i in key_tables)


def _readable(tables: tuple[JoinedTable, ...], plan: Callable[[], QueryPlan]) -> QueryPlan:
    """Run `plan`, turning flat column names in a refusal back into `alias.column`."""
    try:
        return plan()
    except UnsupportedQueryError as error:
        message = str(error)
        for table in tables:
            pattern = re.compile(re.escape(f"{table.name}__") + r"(\w+)")
            message = pattern.sub(rf"{table.alias}.\1", message)
        message = message.replace("`", "")
        raise UnsupportedQueryError(message) from None
