"""Which plans this process has already run a round of: what its next round's estimates
must still count as first use.

Why: each phase runs in a `spark-submit` of its own, whose JVM loads classes, generates
code and builds Delta's first snapshot during its first round, so that round takes several
times its warm estimate, and by how much depends on the plan (`Rates.first_use`). A process
that has run a plan no longer pays for it; the set lives as long as the process (the JVM
is the one that warmed up).
"""

from __future__ import annotations

from collections.abc import Iterable

from airflow_backfill.engine.planning.round_plan import INCREMENTAL, RECOMPUTE, RoundPlan

_ran: set[str] = set()


def plans_run() -> frozenset[str]:
    """The plans (and the ways an aggregate's round wrote its tables) this process ran."""
    return frozenset(_ran)


def mark_run(plan: RoundPlan) -> None:
    """Remember that this process ran `plan`, every way it wrote a table and, for any plan
    but a recompute, an incremental round (what the estimates before the feed call the
    least incremental round, as a join's do)."""
    _ran.add(plan.plan)
    _ran.update(plan.writes.values())
    if plan.plan != RECOMPUTE:
        _ran.add(INCREMENTAL)


def forget(plans: Iterable[str] | None = None) -> None:
    """Forget `plans` (all when None): for tests that play a fresh process."""
    if plans is None:
        _ran.clear()
    else:
        _ran.difference_update(plans)
