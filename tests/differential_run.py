"""One run of the differential harness: MVs of every kind over `typed_tables` upstreams,
built and maintained by the engine's phases in this process, whose time zone, locale and
Spark settings the caller chose (tests/test_differential.py runs it under several).

    python tests/differential_run.py WORK_FOLDER [--sizes default,spark]

For each size policy named (`engine/sizes.py`: `default` keeps small rounds in the driver,
`spark` sends every round through Spark and Delta's own commands) it creates the two
upstreams, snapshots six MVs (stateless with and without a WHERE, an aggregate, an MV over
that aggregate keyed by its NULL-able group, a LEFT join and a grouped inner join), then
applies six rounds of upstream commits: appends above the largest key, updates, deletes
alone, a mix with the joined table changing followed by keys moved and rows leaving the
WHERE (two commits in one round), a round every MV recomputes, and a round applied by the
forward phase. Incremental rounds take each
write way in turn (merge, replace, delete, overwrite, append), whatever the estimates say,
and recomputes alternate between overwriting the MV and writing only the rows that differ.

It writes `WORK_FOLDER/manifest.json`: each MV's location, query, app id and upstreams, for
the caller to compare every MV version with Spark's own recompute at its watermark. It
never compares anything itself: this process is the one under test.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import typed_tables as typed  # noqa: E402

WAYS = ("append", "delete", "patch", "replace", "overwrite", "merge")
"""The incremental write ways, the most rarely offered first (an append only for changes
whose keys are all new, a delete for changes without new rows)."""
RECOMPUTE_WAYS = ("difference", "overwrite")
INITIAL_ROWS = 40
SEED = 59


def mv_specs(root: str, tables: dict[str, str]) -> dict[str, dict[str, Any]]:
    """The six MVs, in the order their rounds run (an MV after the one it reads)."""
    both = {"t": {"table": tables["typed"], "primary_key": ["id"]},
            "dims": {"table": tables["dims"], "primary_key": ["bid"]}}
    return {
        "everything": {"source": tables["typed"], "primary_key": ["id"], "query": "SELECT * FROM source"},
        "computed": {"source": tables["typed"], "primary_key": ["id"], "query": (
            "SELECT id, grp, ts - INTERVAL 90 MINUTES AS earlier, CAST(ts AS DATE) AS ts_day, hour(ts) AS ts_hour, "
            "date_sub(day, 1) AS day_before, money * 3 AS tripled, upper(s) AS shout, st.t AS inner_ts, ntz, "
            "stamps, bin, f + 1 AS f1 FROM source WHERE flag")},
        "grouped": {"source": tables["typed"], "primary_key": ["id"], "query": (
            "SELECT grp, COUNT(*) AS n, SUM(money) AS total, SUM(sm) AS sms, MIN(ts) AS first_ts, "
            "MAX(ntz) AS last_ntz, MIN(day) AS first_day, MAX(s) AS max_s, AVG(money) AS avg_money, "
            "COUNT(DISTINCT i) AS distinct_i, MAX(d) AS max_d, MIN(dec) AS min_dec, "
            "SUM(CASE WHEN dec BETWEEN -1000000 AND 1000000 THEN dec END) AS small_dec_sum FROM source GROUP BY grp")},
        "over_grouped": {"source": f"{root}/grouped", "primary_key": ["grp"],
                         "query": "SELECT grp, n, first_ts, last_ntz, total FROM source WHERE n > 1"},
        "joined": {"sources": both, "query": (
            "SELECT t.id, t.ts, t.dec, t.st, t.ntz, t.mp, t.arr, d.label, d.since, d.weight, d.ratio "
            "FROM t LEFT JOIN dims d ON t.bid = d.bid")},
        "joined_grouped": {"sources": both, "query": (
            "SELECT d.label, COUNT(*) AS n, SUM(t.money) AS money, SUM(t.sm) AS sms, AVG(t.money) AS avg_money "
            "FROM t JOIN dims d ON t.bid = d.bid GROUP BY d.label")},
    }


class WayTurns:
    """Every incremental write takes a way its estimates offer (they offer only the ways
    that can apply the round's changes) that its kind of write has not taken yet, else the
    next in turn."""

    def __init__(self) -> None:
        self.turns: dict[str, int] = {}
        self.taken: list[tuple[str, str]] = []

    def next_way(self, estimates: dict[str, float], kind: str) -> str:
        offered = [way for way in WAYS if way in estimates]
        if not offered:
            return min(estimates, key=estimates.__getitem__)
        untaken = [way for way in offered if (kind, way) not in self.taken]
        turn = self.turns.get(kind, 0)
        self.turns[kind] = turn + 1
        way = untaken[0] if untaken else offered[turn % len(offered)]
        self.taken.append((kind, way))
        return way

    def recompute_writing(self, plan: Any, ways: dict[str, float]) -> Any:
        """Recomputes alternate between overwriting the MV and writing only its difference."""
        way = RECOMPUTE_WAYS[sum(1 for kind, _ in self.taken if kind == "recompute") % len(RECOMPUTE_WAYS)]
        self.taken.append(("recompute", way))
        return plan.with_writes(mv=way) if way == "difference" else plan

    @contextmanager
    def installed(self) -> Iterator[None]:
        from airflow_backfill.engine.aggregates import apply as aggregate_apply
        from airflow_backfill.engine.joins import apply as join_apply
        from airflow_backfill.engine.phases import apply as stateless_apply
        from airflow_backfill.engine.rounds import plan_choice

        saved = (stateless_apply.plan_round, join_apply.plan_round, aggregate_apply._cheapest)
        recomputes = (plan_choice, stateless_apply, aggregate_apply)
        saved_recompute = [module.recompute_writing for module in recomputes]
        for module in recomputes:
            module.recompute_writing = self.recompute_writing

        def plan(kind: str, planned: Callable) -> Callable:
            def chosen(job: Any, estimates: dict[str, float], facts: str) -> Any:
                picked = planned(job, estimates, facts)
                if picked.plan == "recompute":
                    return picked
                return dataclasses.replace(picked, plan=self.next_way(estimates, kind))
            return chosen

        stateless_apply.plan_round = plan("stateless", saved[0])
        join_apply.plan_round = plan("join", saved[1])
        aggregate_apply._cheapest = lambda estimates, kind="aggregate": self.next_way(estimates, kind)
        try:
            yield
        finally:
            stateless_apply.plan_round, join_apply.plan_round, aggregate_apply._cheapest = saved
            for module, original in zip(recomputes, saved_recompute, strict=True):
                module.recompute_writing = original


def build_jobs(root: str, tables: dict[str, str], names: list[str] | None = None) -> dict[str, Any]:
    from airflow_backfill.job import BackfillJob

    jobs = {}
    for name, spec in mv_specs(root, tables).items():
        if names and name not in names:
            continue
        jobs[name] = BackfillJob(name=name, target=f"{root}/{name}", lag_threshold=0, poll_interval=0.05,
                                 backfill_parallelism=2, parallelism=1, round_plan="incremental", **spec)
    return jobs


class Scenario:
    """The upstreams, the MVs over them and the rounds that change them."""

    def __init__(self, spark: Any, root: str, seed: int) -> None:
        self.spark = spark
        self.root = root
        self.rows = typed.TypedRows(seed)
        self.tables = {"typed": f"{root}/typed", "dims": f"{root}/dims"}
        self.next_id = 0
        self.ids: list[int] = []

    def create_upstreams(self) -> None:
        rows = [self.rows.typed(self._new_id()) for _ in range(INITIAL_ROWS)]
        typed.write_new_table(self.spark, self.tables["typed"], typed.arrow_rows(rows, typed.typed_schema()),
                              typed.TYPED_DDL)
        dims = [self.rows.dims(bid) for bid in range(5)]  # bid 5 dangles
        typed.write_new_table(self.spark, self.tables["dims"], typed.arrow_rows(dims, typed.dims_schema()),
                              typed.DIMS_DDL)

    def _new_id(self) -> int:
        self.next_id += 1
        self.ids.append(self.next_id * 10)
        return self.next_id * 10

    def _some(self, count: int) -> list[int]:
        return self.rows.rng.sample(sorted(self.ids), min(count, len(self.ids)))

    def upsert(self, ids: list[int], deletes: list[int] = ()) -> None:  # type: ignore[assignment]
        rows = typed.arrow_rows([self.rows.typed(row_id) for row_id in ids], typed.typed_schema())
        typed.merge_rows(self.spark, self.tables["typed"], rows, typed.TYPED_DDL, "id", list(deletes))
        self.ids = [i for i in self.ids if i not in set(deletes)] + [i for i in ids if i not in self.ids]

    # ---- the rounds' upstream commits -----------------------------------------------------

    def appended_above(self) -> None:
        rows = [self.rows.typed(self._new_id()) for _ in range(6)]
        (self.spark.createDataFrame(typed.arrow_rows(rows, typed.typed_schema()), schema=typed.TYPED_DDL)
         .write.format("delta").mode("append").save(self.tables["typed"]))

    def updated(self) -> None:
        self.upsert(self._some(5))

    def deleted(self) -> None:
        gone = self._some(3)
        self.spark.sql(f"DELETE FROM delta.`{self.tables['typed']}` WHERE id IN ({', '.join(map(str, gone))})")
        self.ids = [i for i in self.ids if i not in gone]

    def mixed(self) -> None:
        chosen = self._some(5)
        gaps = [i + 5 for i in self._some(2) if i + 5 not in self.ids]  # new keys below the largest
        self.upsert(chosen[:3] + gaps, deletes=chosen[3:])
        dims = typed.arrow_rows([self.rows.dims(1), self.rows.dims(6)], typed.dims_schema())
        typed.merge_rows(self.spark, self.tables["dims"], dims, typed.DIMS_DDL, "bid", [2])

    def mixed_then_moved(self) -> None:
        """Two commits one round applies together: netting across commits."""
        self.mixed()
        self.moved()

    def moved(self) -> None:
        moved = self._some(2)
        self.spark.sql(f"UPDATE delta.`{self.tables['typed']}` SET id = id + 1 WHERE id IN "
                       f"({', '.join(map(str, moved))})")
        self.ids = [i + 1 if i in moved else i for i in self.ids]
        flipped = self._some(4)
        self.spark.sql(f"UPDATE delta.`{self.tables['typed']}` SET flag = NOT coalesce(flag, false), "
                       f"grp = CASE WHEN grp IS NULL THEN 'north' ELSE NULL END WHERE id IN "
                       f"({', '.join(map(str, flipped))})")


def run_policy(spark: Any, root: str, policy: str, seed: int, names: list[str] | None = None) -> dict[str, Any]:
    """Build and maintain the MVs under one size policy; what the caller needs to check them."""
    from airflow_backfill.engine.phases.catch_up import run_catch_up
    from airflow_backfill.engine.phases.forward import ForwardBounds, run_forward
    from airflow_backfill.engine.phases.snapshot import run_snapshot

    scenario = Scenario(spark, root, seed)
    scenario.create_upstreams()
    jobs = build_jobs(root, scenario.tables, names)
    turns = WayTurns()
    with turns.installed():
        for job in jobs.values():
            run_snapshot(spark, job)
        rounds: list[tuple[str, Callable[[], None]]] = [
            ("appended above", scenario.appended_above), ("updated", scenario.updated),
            ("deleted", scenario.deleted), ("mixed, then keys moved", scenario.mixed_then_moved),
            ("recomputed", scenario.updated),
        ]
        for label, change in rounds:
            change()
            for job in jobs.values():
                chosen = dataclasses.replace(job, round_plan="recompute") if label == "recomputed" else job
                run_catch_up(spark, chosen)
            logging.info("round %r applied to every MV", label)
        scenario.updated()
        for job in jobs.values():
            run_forward(spark, job, bounds=ForwardBounds(max_epochs=1, idle_timeout=10))
    return {
        "policy": policy, "tables": scenario.tables, "ways": sorted(set(turns.taken)),
        "mvs": {name: {"target": job.target, "app_id": job.app_id, "query": job.query,
                       "source": job.source or None, "sources": {u.name: u.table for u in job.upstreams} or None}
                for name, job in jobs.items()},
    }


def run_policies(spark: Any, work: str, policies: list[str], seed: int, names: list[str] | None = None) -> dict:
    """Every size policy named, one after the other in `spark`: the manifest, also written
    to `work/manifest.json`."""
    from airflow_backfill.engine.sizes import PRESETS, SIZES_VARIABLE, overridden

    os.environ.pop(SIZES_VARIABLE, None)
    runs = []
    for policy in policies:
        with overridden(**dataclasses.asdict(PRESETS[policy])):
            runs.append(run_policy(spark, f"{work}/{policy}", policy, seed, names))
    manifest = {"runs": runs}
    Path(work, "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def main(argv: list[str] | None = None) -> int:
    from airflow_backfill.engine.spark_session import build_spark_session

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("work")
    parser.add_argument("--sizes", default="default,spark")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--mvs", help="only these MVs (comma-separated names), to look into one")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    spark = build_spark_session("differential", 2)
    try:
        run_policies(spark, args.work, args.sizes.split(","), args.seed, args.mvs.split(",") if args.mvs else None)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
