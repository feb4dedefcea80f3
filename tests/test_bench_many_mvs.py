"""The many_mvs benchmark's own arithmetic: the mixes of MVs it declares, freshness read
from Delta logs (a base upstream's commit to the first MV commit that reflects it, through
chains of MVs and joins' vectors), the rounds' seconds read from the MVs' state files and
the shared forward's log, and the MVs' writes read from their logs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_backfill.engine import job_state
from airflow_backfill.engine.planning.join_query import plan_join
from airflow_backfill.engine.planning.query import plan_query
from airflow_backfill.exceptions import BackfillConfigError
from airflow_backfill.job_folder import load_job_folder
from bench import forward_log
from bench.many_mvs import exact_sample, round_costs, write_job_folder
from bench.mv_freshness import freshness
from bench.mv_kinds import kinds_of
from bench.mv_workloads import mv_declarations
from bench.mv_writes import writes
from bench.user_mvs import JOINS, REFUSED, user_mv_declarations
from bench.user_tables import TABLES


def test_fifty_mvs_are_a_loadable_folder_with_the_issues_mix(tmp_path: Path):
    jobs = mv_declarations(50, str(tmp_path / "lake"))
    counts = {kind: list(kinds_of(jobs).values()).count(kind) for kind in ("stateless", "aggregate", "over_mv", "join")}
    assert counts == {"stateless": 30, "aggregate": 10, "over_mv": 5, "join": 5}
    write_job_folder(tmp_path / "jobs", jobs)
    folder = load_job_folder(tmp_path / "jobs")
    assert folder.errors == () and len(folder.jobs) == 50
    over_mvs = [entry.name for entry in folder.jobs if folder.upstream_jobs(entry)]
    assert len(over_mvs) == 5 and all(name.startswith("agg_") for name in over_mvs)
    assert len({job.get("source") for job in jobs if "source" in job} & {
        str(tmp_path / "lake" / f"upstream_{index}") for index in range(5)}) == 5


def test_the_users_fifty_mvs_are_the_issues_mix_and_the_planner_takes_each(tmp_path: Path):
    jobs = user_mv_declarations(str(tmp_path / "lake"))
    kinds = kinds_of(jobs)
    counts = {kind: list(kinds.values()).count(kind) for kind in ("stateless", "aggregate", "over_mv", "join")}
    assert counts == {"stateless": 20, "aggregate": 15, "over_mv": 8, "join": 7}
    by_target = {job["target"]: job for job in jobs}
    depth = {}
    for job in jobs:  # sources come first: a chain's depth from its upstream
        source = by_target.get(job.get("source"))
        depth[job["name"]] = 1 if source is None else depth[source["name"]] + 1
    assert max(depth.values()) == 3 and 2 in depth.values()
    grouped = [job for job in jobs if "sources" in job and plan_join(
        job["query"], [(a, s["primary_key"]) for a, s in job["sources"].items()],
        {a: TABLES[Path(s["table"]).name].schema.names for a, s in job["sources"].items()}).flat.aggregate is not None]
    assert len(grouped) == 2
    assert {"LEFT JOIN" in query for _, query in JOINS.values()} == {True, False}
    assert all(job["query"].count("WHERE") for job in jobs if kinds[job["name"]] == "stateless")
    assert {TABLES[Path(job["source"]).name].key for job in jobs if kinds[job["name"]] == "stateless"} == {
        ("order_id",), ("customer_code",), ("order_id", "line_no"), ("payment_id",)}
    write_job_folder(tmp_path / "jobs", jobs)
    assert len({path.stem for path in (tmp_path / "jobs").glob("*.yaml")}) == 50


@pytest.mark.parametrize("query", list(REFUSED))
def test_the_shapes_listed_as_refused_are_refused(query: str):
    """The mix keeps a variant of each: the list must stay true as the engine changes."""
    with pytest.raises(BackfillConfigError):
        if " JOIN " in query:
            plan_join(query, [("o", ["order_id"]), ("c", ["customer_code"])],
                      {"o": TABLES["orders"].schema.names, "c": TABLES["customers"].schema.names})
        else:
            plan_query(query, ("order_id",))


def write_log(table: Path, commits: list[tuple[float, dict]]) -> None:
    """A Delta log whose version i was committed at commits[i][0] (seconds) with the given extras."""
    log = table / "_delta_log"
    log.mkdir(parents=True)
    for version, (at, extra) in enumerate(commits):
        lines = [{"commitInfo": {"timestamp": int(at * 1000), **extra.get("info", {})}}]
        if "txn" in extra:
            lines.append({"txn": {"appId": extra["txn"][0], "version": extra["txn"][1]}})
        lines += extra.get("actions", [])
        (log / f"{version:020d}.json").write_text("\n".join(json.dumps(line) for line in lines) + "\n")


def test_freshness_is_upstream_commit_to_the_first_mv_commit_reflecting_it(tmp_path: Path):
    upstream, mv = tmp_path / "upstream", tmp_path / "mv"
    write_log(upstream, [(90.0, {}), (100.0, {}), (101.0, {}), (102.0, {}), (103.5, {})])
    app = "airflow_backfill/mv"
    write_log(mv, [(95.0, {"txn": (app, 0)}), (100.5, {"txn": (app, 1)}), (104.0, {"txn": (app, 3)})])
    jobs = [{"name": "mv", "source": str(upstream), "target": str(mv)}]
    # Versions 1, 2 and 3 were committed in the window: reflected 0.5 s, 3 s and 2 s later.
    figures = freshness(jobs, {"mv": "stateless"}, start=99.0, end=103.0, observed_until=110.0)
    assert (figures["median_s"], figures["max_s"], figures["samples"]) == (2.0, 3.0, 3)
    assert figures["not_reflected_counted_as_lower_bound"] == 0
    # Version 4 is never reflected: it counts with the time it waited, not left out.
    figures = freshness(jobs, {"mv": "stateless"}, start=99.0, end=104.0, observed_until=110.0)
    assert (figures["samples"], figures["max_s"], figures["not_reflected_counted_as_lower_bound"]) == (4, 6.5, 1)


def watermarks(vector: dict[str, int]) -> dict:
    return {"userMetadata": json.dumps({"airflow_backfill.watermarks": json.dumps(vector)})}


def test_a_joins_freshness_follows_each_upstream_through_its_vector(tmp_path: Path):
    left, right, mv = tmp_path / "left", tmp_path / "right", tmp_path / "join"
    write_log(left, [(90.0, {}), (100.0, {})])
    write_log(right, [(90.0, {}), (101.0, {})])
    app = "airflow_backfill/join"
    write_log(mv, [(95.0, {"txn": (app, 0)}), (100.4, {"txn": (app, 1), "info": watermarks({"a": 1, "b": 0})}),
                   (102.0, {"txn": (app, 2), "info": watermarks({"a": 1, "b": 1})})])
    jobs = [{"name": "join", "target": str(mv), "sources": {"a": {"table": str(left)}, "b": {"table": str(right)}}}]
    figures = freshness(jobs, {"join": "join"}, start=99.0, end=103.0, observed_until=110.0)
    assert (figures["samples"], figures["median_s"], figures["max_s"]) == (2, 0.7, 1.0)  # 0.4 s and 1 s


def chain_history(root: Path) -> list[dict]:
    """Upstreams U and V; A over U, B over A, C over B (a chain of three), and J joining U
    and V. B's version 3 is a maintenance commit (no watermark)."""
    u, v = root / "u", root / "v"
    write_log(u, [(90.0, {}), (100.0, {}), (101.0, {}), (102.0, {}), (103.5, {})])
    write_log(v, [(90.0, {}), (100.5, {})])
    paths = {name: root / name for name in "abcj"}
    app = {name: f"airflow_backfill/{name}" for name in "abcj"}
    write_log(paths["a"], [(95.0, {"txn": (app["a"], 0)}), (100.4, {"txn": (app["a"], 1)}),
                           (102.5, {"txn": (app["a"], 3)}), (104.0, {"txn": (app["a"], 4)})])
    write_log(paths["b"], [(96.0, {"txn": (app["b"], 0)}), (101.0, {"txn": (app["b"], 1)}),
                           (103.0, {"txn": (app["b"], 2)}), (103.2, {}), (106.0, {"txn": (app["b"], 3)})])
    write_log(paths["c"], [(97.0, {"txn": (app["c"], 0)}), (102.0, {"txn": (app["c"], 1)}),
                           (105.0, {"txn": (app["c"], 3)}), (107.0, {"txn": (app["c"], 4)})])
    write_log(paths["j"], [(95.0, {"txn": (app["j"], 0), "info": watermarks({"a": 0, "b": 0})}),
                           (101.5, {"txn": (app["j"], 3), "info": watermarks({"a": 2, "b": 1})}),
                           (104.5, {"txn": (app["j"], 5), "info": watermarks({"a": 4, "b": 1})})])
    return [{"name": "a", "source": str(u), "target": str(paths["a"])},
            {"name": "b", "source": str(paths["a"]), "target": str(paths["b"])},
            {"name": "c", "source": str(paths["b"]), "target": str(paths["c"])},
            {"name": "j", "target": str(paths["j"]), "sources": {"a": {"table": str(u)}, "b": {"table": str(v)}}}]


def test_an_mv_over_an_mv_is_measured_against_its_base_upstream_through_the_chain(tmp_path: Path):
    """Worked by hand, for U's commits 1 - 4 (at 100, 101, 102, 103.5) and V's 1 (100.5):

    A reflects U 1 at 100.4, U 3 at 102.5, U 4 at 104: lags 0.4, 1.5, 0.5, 0.5.
    B reflects A's versions; A 1 -> U 1 at 101, A 2 -> U 3 at 103, A 3 -> U 4 at 106:
    lags 1, 2, 1, 2.5.
    C reflects B's versions; B 1 -> U 1 at 102, B 3 (maintenance) -> B 2 -> U 3 at 105,
    B 4 -> U 4 at 107: lags 2, 4, 3, 3.5.
    J reflects U 2 at 101.5 and U 4 at 104.5 (lags 1.5, 0.5, 2.5, 1) and V 1 at 101.5 (1).
    """
    jobs = chain_history(tmp_path)
    kinds = {"a": "stateless", "b": "over_mv", "c": "over_mv", "j": "join"}
    figures = freshness(jobs, kinds, start=99.0, end=104.0, observed_until=110.0)
    assert figures["samples"] == 4 + 4 + 4 + 5 and figures["not_reflected_counted_as_lower_bound"] == 0
    assert figures["kinds"]["stateless"] == {"median_s": 0.5, "p95_s": 1.5, "max_s": 1.5, "samples": 4}
    assert figures["kinds"]["over_mv"] == {"median_s": 2.25, "p95_s": 4.0, "max_s": 4.0, "samples": 8}
    assert figures["kinds"]["join"] == {"median_s": 1.0, "p95_s": 2.5, "max_s": 2.5, "samples": 5}
    assert figures["worst_mv_medians_s"] == {"c": 3.25, "b": 1.5, "j": 1.0, "a": 0.5}
    # C's last commit not made yet: U 4 waits for it, counted up to the observation.
    (tmp_path / "c" / "_delta_log" / f"{3:020d}.json").unlink()
    figures = freshness(jobs, kinds, start=99.0, end=104.0, observed_until=110.0)
    assert figures["not_reflected_counted_as_lower_bound"] == 1 and figures["max_s"] == 6.5


def test_round_costs_are_per_kind_and_a_joins_are_its_whole_rounds(tmp_path: Path):
    def kept(target: Path, observations: list[tuple[str, float]]) -> None:
        target.mkdir()
        job_state.update_state(str(target), round_costs=[{"plan": plan, "seconds": seconds, "estimate_s": 1.0,
                                                          "epoch": epoch} for epoch, (plan, seconds) in
                                                         enumerate(observations)])

    kept(tmp_path / "plain_0", [("overwrite", 0.2), ("replace", 0.4), ("overwrite", 0.3)])
    kept(tmp_path / "plain_1", [("overwrite", 0.5)])
    kept(tmp_path / "join_0", [("overwrite", 0.5), ("join round", 2.0), ("merge", 0.7), ("join round", 3.0)])
    (tmp_path / "agg_0").mkdir()  # no round yet: no entry
    jobs = [{"name": path.name, "target": str(path)} for path in sorted(tmp_path.iterdir())]
    kinds = {"plain_0": "stateless", "plain_1": "stateless", "join_0": "join", "agg_0": "aggregate"}
    assert round_costs(jobs, kinds) == {
        "stateless": {"rounds": 4, "median_s": 0.35, "p90_s": 0.5, "plans": {"overwrite": 3, "replace": 1}},
        "join": {"rounds": 2, "median_s": 2.5, "p90_s": 3.0, "plans": {"overwrite": 1, "merge": 1}},
    }


FORWARD_LOG = """\
2026-12-05 10:00:01,000 INFO airflow_backfill.shared_forward.loop: shared forward: a (delta) joined the set
2026-12-05 10:00:02,000 INFO bench.key_check_probe: [a] bench key check: 5.250 s, upstream read
2026-12-05 10:00:02,100 INFO airflow_backfill.engine.rounds.key_check: [a] upstream keys the round added checked at epoch 4: each is held once
2026-12-05 10:00:02,500 INFO airflow_backfill.engine.phases.apply: [a] forward: applied epochs 3..4 (12 change rows, 5 MV keys, plan overwrite) in 6.10s
2026-12-05 10:00:03,000 INFO bench.key_check_probe: [a] bench key check: 0.250 s, no upstream read
2026-12-05 10:00:03,200 INFO bench.key_check_probe: [a] bench key check: 0.040 s, driver lookup
2026-12-05 10:00:03,210 INFO airflow_backfill.engine.rounds.key_check: [a] 3 upstream keys the round added looked up at epoch 5 in 1 of 4 files (90 key values read): each is held once
2026-12-05 10:00:04,000 INFO airflow_backfill.engine.phases.apply: [g] forward: applied epochs 1..9 (40 change rows, 3 MV keys, plan incremental (state overwrite, mv overwrite)) in 1.50s
[70.763s][warning][codecache] CodeCache is full. Compiler has been disabled.
java.lang.VirtualMachineError: Out of space in CodeCache for adapters
2026-12-05 10:09:00,000 INFO bench.key_check_probe: [a] bench key check: 9.000 s, upstream read
"""


def test_the_forward_log_gives_rounds_key_checks_and_the_code_cache():
    kinds = {"a": "stateless", "g": "aggregate"}
    start = forward_log.time.mktime((2026, 12, 5, 10, 0, 0, 0, 0, -1))
    end = start + 60
    rounds = forward_log.rounds(FORWARD_LOG, kinds, start, end)
    assert rounds["stateless"]["plans"] == {"overwrite": 1} and rounds["stateless"]["median_s"] == 6.1
    assert rounds["aggregate"]["plans"] == {"incremental (state overwrite, mv overwrite)": 1}
    checks = forward_log.key_checks(FORWARD_LOG, kinds, start, end)  # the check at 10:09 is outside
    assert checks["all"]["upstream_read"] == {"count": 1, "median_s": 5.25, "p90_s": 5.25, "max_s": 5.25,
                                              "total_s": 5.2}
    assert checks["all"]["no_upstream_read"]["count"] == 1
    assert checks["all"]["driver_lookup"]["count"] == 1 and checks["all"]["driver_lookup"]["median_s"] == 0.04
    assert checks["engine_lines"] == {"upstream_read": 1, "driver_lookup": 1, "no_upstream_read": 0}
    assert forward_log.code_cache(FORWARD_LOG) == {"full": True, "at_jvm_uptime_s": 70.763,
                                                    "out_of_code_cache_errors": 1}
    assert forward_log.code_cache("all well") == {"full": False, "at_jvm_uptime_s": None, "out_of_code_cache_errors": 0}


def added(path: str, rows: int) -> dict:
    return {"add": {"path": path, "stats": json.dumps({"numRecords": rows})}}


def removed(path: str) -> dict:
    return {"remove": {"path": path}}


def test_a_round_that_removes_every_file_of_the_mv_is_a_whole_rewrite(tmp_path: Path):
    """Version 1 adds a file beside the first; version 2 rewrites one of two (not whole);
    version 3 removes both and adds one (whole); version 4 swaps a deletion vector on the
    only file (same path: not a rewrite)."""
    app = "airflow_backfill/mv"
    write_log(tmp_path / "mv", [
        (90.0, {"actions": [added("f0", 1000)]}),
        (100.0, {"txn": (app, 1), "actions": [added("f1", 5)]}),
        (101.0, {"txn": (app, 2), "actions": [removed("f1"), added("f2", 6)]}),
        (102.0, {"txn": (app, 3), "actions": [removed("f0"), removed("f2"), added("f3", 1004)]}),
        (103.0, {"txn": (app, 4), "actions": [removed("f3"), added("f3", 1004)]}),
    ])
    jobs = [{"name": "mv", "target": str(tmp_path / "mv")}]
    found = writes(jobs, {"mv": "stateless"}, 99.0, 104.0)
    assert found["kinds"]["stateless"]["rounds"] == 4 and found["whole_mv_rewrites"] == 1
    assert found["most_rewritten"] == {"mv": 1}
    assert found["kinds"]["stateless"]["rows_written_median"] == 5.5  # 5, 6, 1004 and 0 rows written


def test_the_every_version_sample_takes_some_mvs_of_each_kind(tmp_path: Path):
    jobs = user_mv_declarations(str(tmp_path / "lake"))
    sample = exact_sample(jobs, kinds_of(jobs), 2)
    assert len(sample) == 8 and len(set(sample)) == 8
    assert {kinds_of(jobs)[name] for name in sample} == {"stateless", "aggregate", "over_mv", "join"}
