"""Choose one version of each table so that all of them reflect the same upstream epochs.

Policies, as a streaming database picks a batch query's epoch per table:

- `common` (the default): the newest epochs that every table has committed. Tables over
  one upstream meet at the newest upstream version each of them committed; a join, and a
  chain of MVs, meet the others through the upstream versions they reflect. When several
  upstreams are involved, "newest" is the agreeing choice with the most upstream versions
  applied in all.
- `latest`: each table's newest version, as a plain read gets it; the answer says whether
  they agree.
- `at`: the versions that reflect the given epochs; refused, naming the table, when one
  has not reached them, never committed them, or no longer holds them (vacuumed, log
  expired).

A table named only as part of a set (not `explicit`) is left out while its job is still
creating it (snapshot or catch-up, a Kafka MV before every split is Finished), so that it
holds nobody back; the answer says which and why. Everything is read from the Delta logs
(delta-rs); nothing here starts Spark.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from airflow_backfill.engine import job_state
from airflow_backfill.engine.consistency.answer import (
    DEFAULT_HISTORY,
    POLICY_COMMON,
    ConsistentVersions,
    LeftOut,
    TableVersion,
)
from airflow_backfill.engine.consistency.epochs import resolve_epochs
from airflow_backfill.engine.consistency.history import Epochs, TableHistory
from airflow_backfill.engine.consistency.readable import check_readable
from airflow_backfill.engine.consistency.tables import (
    KIND_JOIN,
    KIND_MV,
    KIND_TABLE,
    TableSpec,
    spec_for_table,
    table_name,
)
from airflow_backfill.engine.delta.log import table_exists
from airflow_backfill.exceptions import (
    BackfillConfigError,
    ConsistencyError,
    NotYetConsistentError,
    TargetError,
)

POLICY_LATEST = "latest"
POLICY_AT = "at"
POLICIES = (POLICY_COMMON, POLICY_LATEST, POLICY_AT)
FIRST_DEPTH = 50
"""Versions searched first; four times more each time nothing agrees, up to the history."""


def validate_policy(policy: Any, at: Any) -> str:
    """The policy, checked against `at` (given exactly with `at`)."""
    if policy not in POLICIES:
        raise BackfillConfigError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}.")
    if (policy == POLICY_AT) != (at is not None):
        raise BackfillConfigError("give the epochs with policy `at` (--at 1200, or at=1200 in Python), and only "
                                  "with it.")
    return str(policy)


def consistent_versions(
    specs: Sequence[TableSpec], *, policy: str = POLICY_COMMON, at: Any = None, history: int = DEFAULT_HISTORY,
) -> ConsistentVersions:
    """One version of each table in `specs`, chosen by `policy` (see the module's docstring).

    :param at: with policy `at`: a version of the one upstream, or `{table: version}` for
        several (a table by URI or folder name).
    :param history: versions of each MV searched at most.
    :raises NotYetConsistentError: the tables do not agree as asked yet (waiting may help).
    :raises ConsistencyError: they cannot (the versions are gone); nothing was read.
    """
    policy = validate_policy(policy, at)
    if not specs:
        raise BackfillConfigError("name at least one table to read (a job or a table URI).")
    _refuse_repeated(specs)
    absent = [spec for spec in specs if spec.kind != KIND_TABLE and not table_exists(spec.uri)]
    for spec in absent:
        if spec.explicit:
            raise NotYetConsistentError(
                f"{spec.name}: its MV does not exist yet at {spec.uri}: its job has not committed a snapshot. "
                "Wait for it, or check the job's target."
            )
    histories = _histories([spec for spec in specs if spec not in absent])
    named = [histories[spec.uri] for spec in specs if spec not in absent]
    left_out = [LeftOut(spec.name, spec.uri, f"not created yet: no table at {spec.uri}") for spec in absent]
    left_out += [LeftOut(h.spec.name, h.spec.uri, reason) for h in named
                 if not h.spec.explicit and (reason := _being_created(h)) is not None]
    read = [h for h in named if h.spec.name not in {table.name for table in left_out}]
    if not read:
        raise NotYetConsistentError("every table is being created: " + "; ".join(
            f"{table.name}: {table.reason}" for table in left_out))
    for table in read:
        _require_an_epoch(table, history)
    if policy == POLICY_LATEST:
        chosen = {h.spec.name: _newest(h, history) for h in read}
    elif policy == POLICY_AT:
        target = resolve_epochs(at, set().union(*(h.bases() for h in read)), every_base=True)
        chosen = {h.spec.name: _version_at(h, target, history) for h in read}
    else:
        chosen = _common(read, history)
    for table in read:
        check_readable(table.spec.name, table.spec.uri, chosen[table.spec.name][0])
    return _answer(policy, read, chosen, left_out)


def base_tables(specs: Sequence[TableSpec]) -> set[str]:
    """The URIs of the base tables the tables' epochs name (their upstreams, down MV chains)."""
    _refuse_repeated(specs)
    histories = _histories(specs)
    return set().union(*(histories[spec.uri].bases() for spec in specs))


def current_epochs(spec: TableSpec) -> tuple[int, Epochs] | None:
    """The table's newest version and the base epochs it reflects; None while its latest
    version reflects none (not created yet)."""
    table = _histories([spec])[spec.uri]
    epochs = table.epochs_at(table.latest)
    return None if epochs is None else (table.latest, epochs)


def epochs_at(spec: TableSpec, version: int) -> Epochs | None:
    """The base epochs version `version` of the table reflects; None when it reflects none.
    An asset event for an MV commit names that commit's epochs, not those of a commit the
    MV made since."""
    return _histories([spec])[spec.uri].epochs_at(version)


def _refuse_repeated(specs: Sequence[TableSpec]) -> None:
    for index, spec in enumerate(specs):
        for earlier in specs[:index]:
            if earlier.name == spec.name or earlier.uri == spec.uri:
                same = "name" if earlier.name == spec.name else "table"
                raise BackfillConfigError(
                    f"{earlier.name} and {spec.name} are the same {same} ({spec.name if same == 'name' else spec.uri}); "
                    "name each table once (a table can be renamed: name=...)."
                )


def _histories(specs: Sequence[TableSpec]) -> dict[str, TableHistory]:
    """The history of every table named, and of every upstream they read down to the base
    tables (an upstream that is not named is recognised from its own log), by URI."""
    named = {spec.uri: spec for spec in specs}
    histories: dict[str, TableHistory] = {}

    def history(uri: str, path: tuple[str, ...]) -> TableHistory:
        if uri in histories:
            return histories[uri]
        if uri in path:
            raise TargetError(f"the tables read each other in a circle ({' -> '.join((*path, uri))}); "
                              "check the jobs' sources.")
        spec = named.get(uri) or spec_for_table(uri, explicit=False)
        upstreams = {name: history(upstream, (*path, uri)) for name, upstream in spec.upstreams.items()}
        histories[uri] = TableHistory(spec, upstreams)
        return histories[uri]

    for spec in specs:
        history(spec.uri, ())
    return histories


def _creating_phase(table: TableHistory) -> str | None:
    """The phase of an MV whose job state says it is still being created; None otherwise."""
    if table.is_base or table.spec.kind not in (KIND_MV, KIND_JOIN):
        return None
    state = job_state.read_state(table.spec.uri)
    if state.get("state") != job_state.STATE_CREATING:
        return None
    return str(state.get("phase") or "snapshot")


def _being_created(table: TableHistory) -> str | None:
    """Why the table's job is still creating it; None when it is created."""
    phase = _creating_phase(table)
    if phase is not None:
        return f"being created (phase {phase}); name it to read it anyway"
    if table.is_base:
        return None
    if table.epochs_at(table.latest) is None:
        return "being created: its latest version reflects no upstream epoch yet; name it to read it anyway"
    return None


def _require_an_epoch(table: TableHistory, history: int) -> None:
    if table.is_base or _newest_or_none(table, history) is not None:
        return
    raise NotYetConsistentError(
        f"{table.spec.name}: none of the latest {history} versions of {table.spec.uri} reflects an upstream epoch "
        "yet: its snapshot has not committed (or, for a Kafka MV, not every split is Finished). Wait for it, "
        "or leave it out."
    )


def _newest_or_none(table: TableHistory, history: int) -> tuple[int, Epochs] | None:
    for depth in _depths(history):
        found = table.candidates(depth)
        if found:
            return found[0]
        if _searched_all(table, depth):
            break
    return None


def _newest(table: TableHistory, history: int) -> tuple[int, Epochs]:
    if table.is_base:
        return table.latest, {table.spec.uri: table.latest}
    newest = _newest_or_none(table, history)
    assert newest is not None  # _require_an_epoch
    return newest


def _depths(history: int) -> Iterable[int]:
    depth = min(FIRST_DEPTH, history)
    while True:
        yield depth
        if depth >= history:
            return
        depth = min(depth * 4, history)


def _searched_all(table: TableHistory, depth: int) -> bool:
    """Whether `candidates(depth)` read down to the table's first version or its log's end."""
    return table.is_base or depth > table.latest or (
        table.log_ends_at is not None and table.log_ends_at >= table.latest - depth)


# ---- at ---------------------------------------------------------------------------------


def _version_at(table: TableHistory, target: Epochs, history: int) -> tuple[int, Epochs]:
    """The table's version that reflects `target` (restricted to its base tables)."""
    wanted = {base: target[base] for base in table.bases()}
    text = _text(wanted)
    if table.is_base:
        version = wanted[table.spec.uri]
        if version > table.latest:
            raise NotYetConsistentError(f"{table.spec.name} has not reached version {version} yet "
                                        f"(its latest is {table.latest}).")
        return version, wanted
    for depth in _depths(history):
        found = table.candidates(depth)
        newer = [(v, e) for v, e in found if _after(e, wanted)]
        match = [(v, e) for v, e in found if e == wanted]
        older = [(v, e) for v, e in found if not _after(e, wanted) and e != wanted]
        if match:
            return match[0]
        if found and not newer:
            raise NotYetConsistentError(
                f"{table.spec.name} has not reached epoch {text}: its newest version {found[0][0]} reflects "
                f"{_text(found[0][1])}. Wait for it, or read an older epoch."
            )
        if older:
            before, after = older[0], newer[-1]
            raise ConsistencyError(
                f"{table.spec.name} never committed epoch {text}: version {before[0]} reflects {_text(before[1])} and "
                f"version {after[0]} {_text(after[1])}. Read an epoch it committed, or use policy common."
            )
        if _searched_all(table, depth):
            if table.log_ends_at is None and found:
                raise ConsistencyError(
                    f"{table.spec.name} has no version at epoch {text}: its oldest version with an epoch, "
                    f"{found[-1][0]}, reflects {_text(found[-1][1])} (it was created later). Read a newer epoch."
                )
            break
    raise ConsistencyError(
        f"{table.spec.name}: no version of {table.spec.uri} still in its log reflects epoch {text} (searched "
        f"{min(history, table.latest + 1)} versions): its older log entries were cleaned up (or lie deeper than "
        "the history searched). Read a newer epoch."
    )


def _after(epochs: Epochs, wanted: Epochs) -> bool:
    """Whether `epochs` is past `wanted` (in at least one base, and behind in none)."""
    return all(epochs[base] >= version for base, version in wanted.items()) and epochs != wanted


def _text(epochs: Epochs) -> str:
    return ", ".join(f"{table_name(base)}@{version}" for base, version in sorted(epochs.items()))


# ---- common -----------------------------------------------------------------------------


def _common(tables: list[TableHistory], history: int) -> dict[str, tuple[int, Epochs]]:
    """The agreeing versions, searching deeper into the MVs' histories until some agree."""
    for depth in _depths(history):
        chosen: dict[str, tuple[int, Epochs]] = {}
        for component in _components(tables):
            best = _best_agreeing(component, depth)
            if best is None:
                break
            chosen.update(best)
        else:
            return chosen
        if all(_searched_all(table, depth) for table in tables):
            break
    newest = "; ".join(f"{t.spec.name} at {_text(_newest(t, history)[1])}" for t in tables)
    creating = [f"{t.spec.name} (phase {phase})" for t in tables if (phase := _creating_phase(t)) is not None]
    if creating:
        raise NotYetConsistentError(
            f"the tables share no upstream epoch in their last {history} versions (newest: {newest}): "
            f"{', '.join(creating)} {'is' if len(creating) == 1 else 'are'} still being created, and commit the "
            "epochs of their backfill, not those the others commit. They meet once the backfill ends and its rounds "
            "commit the epochs the others do. Wait, or use policy latest."
        )
    raise NotYetConsistentError(
        f"the tables share no upstream epoch in their last {history} versions (newest: {newest}). Each MV commits "
        "the upstream versions its rounds end at; they meet once the upstream pauses long enough for all of "
        "them to catch up to one version, or at a multiple of the jobs' round_alignment when they have one. Wait, "
        "or use policy latest."
    )


def _components(tables: list[TableHistory]) -> list[list[TableHistory]]:
    """The tables grouped by the base tables they share (groups sharing none are independent)."""
    groups: list[tuple[set[str], list[TableHistory]]] = []
    for table in tables:
        bases, members = set(table.bases()), [table]
        for group in [g for g in groups if g[0] & bases]:
            groups.remove(group)
            bases |= group[0]
            members = group[1] + members
        groups.append((bases, members))
    return [members for _, members in groups]


def _best_agreeing(tables: list[TableHistory], depth: int) -> dict[str, tuple[int, Epochs]] | None:
    """The choice among the newest `depth` versions of each MV that agrees on every base
    table and applies the most upstream versions in all; base tables follow the MVs."""
    mvs = sorted((t for t in tables if not t.is_base), key=lambda t: -len(t.bases()))
    options = {t.spec.name: t.candidates(depth) for t in mvs}
    by_epochs = {name: {_key(e): (v, e) for v, e in found} for name, found in options.items()}
    best: tuple[int, dict[str, tuple[int, Epochs]]] | None = None

    def visit(index: int, fixed: Epochs, chosen: dict[str, tuple[int, Epochs]]) -> None:
        nonlocal best
        if index == len(mvs):
            score = sum(fixed.values())
            if best is None or score > best[0]:
                best = (score, dict(chosen))
            return
        table = mvs[index]
        bases = table.bases()
        if bases <= fixed.keys():
            hit = by_epochs[table.spec.name].get(_key({base: fixed[base] for base in bases}))
            if hit is not None:
                visit(index + 1, fixed, {**chosen, table.spec.name: hit})
            return
        for version, epochs in options[table.spec.name]:
            if all(fixed.get(base, epoch) == epoch for base, epoch in epochs.items()):
                visit(index + 1, {**fixed, **epochs}, {**chosen, table.spec.name: (version, epochs)})

    visit(0, {}, {})
    if best is None:
        return None
    chosen = best[1]
    fixed = {base: epoch for _, epochs in chosen.values() for base, epoch in epochs.items()}
    for table in tables:
        if table.is_base:
            version = fixed.get(table.spec.uri, table.latest)
            chosen[table.spec.name] = (version, {table.spec.uri: version})
    return chosen


def _key(epochs: Epochs) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(epochs.items()))


# ---- the answer -------------------------------------------------------------------------


def _answer(policy: str, read: list[TableHistory], chosen: dict[str, tuple[int, Epochs]],
            left_out: list[LeftOut]) -> ConsistentVersions:
    tables = {h.spec.name: TableVersion(h.spec.name, h.spec.uri, chosen[h.spec.name][0],
                                        dict(chosen[h.spec.name][1]), h.spec.kind) for h in read}
    merged: Epochs = {}
    agree = True
    for table in tables.values():
        for base, epoch in table.epochs.items():
            agree = agree and merged.setdefault(base, epoch) == epoch
    return ConsistentVersions(policy, tables, left_out, merged if agree else {}, agree)
