"""The many_mvs benchmark's own arithmetic: the mix of MVs it declares, freshness read
from Delta logs (upstream commit to the first MV commit that reflects it), and the rounds'
seconds read from the MVs' state files."""

from __future__ import annotations

import json
from pathlib import Path

from airflow_backfill.engine import job_state
from airflow_backfill.job_folder import load_job_folder
from bench.many_mvs import freshness, mv_declarations, round_costs, write_job_folder


def test_fifty_mvs_are_a_loadable_folder_with_the_issues_mix(tmp_path: Path):
    jobs = mv_declarations(50, str(tmp_path / "lake"))
    kinds = {kind: sum(job["name"].startswith(kind) for job in jobs) for kind in ("plain", "agg", "join")}
    assert kinds == {"plain": 30, "agg": 15, "join": 5}
    write_job_folder(tmp_path / "jobs", jobs)
    folder = load_job_folder(tmp_path / "jobs")
    assert folder.errors == () and len(folder.jobs) == 50
    over_mvs = [entry.name for entry in folder.jobs if folder.upstream_jobs(entry)]
    assert len(over_mvs) == 5 and all(name.startswith("agg_") for name in over_mvs)
    assert len({job.get("source") for job in jobs if "source" in job} & {
        str(tmp_path / "lake" / f"upstream_{index}") for index in range(5)}) == 5


def write_log(table: Path, commits: list[tuple[float, dict]]) -> None:
    """A Delta log whose version i was committed at commits[i][0] (seconds) with the given extras."""
    log = table / "_delta_log"
    log.mkdir(parents=True)
    for version, (at, extra) in enumerate(commits):
        lines = [{"commitInfo": {"timestamp": int(at * 1000), **extra.get("info", {})}}]
        if "txn" in extra:
            lines.append({"txn": {"appId": extra["txn"][0], "version": extra["txn"][1]}})
        (log / f"{version:020d}.json").write_text("\n".join(json.dumps(line) for line in lines) + "\n")


def test_freshness_is_upstream_commit_to_the_first_mv_commit_reflecting_it(tmp_path: Path):
    upstream, mv = tmp_path / "upstream", tmp_path / "mv"
    write_log(upstream, [(90.0, {}), (100.0, {}), (101.0, {}), (102.0, {}), (103.5, {})])
    app = "airflow_backfill/mv"
    write_log(mv, [(95.0, {"txn": (app, 0)}), (100.5, {"txn": (app, 1)}), (104.0, {"txn": (app, 3)})])
    job = {"name": "mv", "source": str(upstream), "target": str(mv)}
    # Versions 1, 2 and 3 were committed in the window: reflected 0.5 s, 3 s and 2 s later.
    figures = freshness([job], start=99.0, end=103.0, observed_until=110.0)
    assert (figures["median_s"], figures["max_s"], figures["samples"]) == (2.0, 3.0, 3)
    assert figures["not_reflected_counted_as_lower_bound"] == 0
    # Version 4 is never reflected: it counts with the time it waited, not left out.
    figures = freshness([job], start=99.0, end=104.0, observed_until=110.0)
    assert (figures["samples"], figures["max_s"], figures["not_reflected_counted_as_lower_bound"]) == (4, 6.5, 1)


def test_a_joins_freshness_follows_each_upstream_through_its_vector(tmp_path: Path):
    left, right, mv = tmp_path / "left", tmp_path / "right", tmp_path / "join"
    write_log(left, [(90.0, {}), (100.0, {})])
    write_log(right, [(90.0, {}), (101.0, {})])
    app = "airflow_backfill/join"
    vector = json.dumps({"a": 1, "b": 0})
    write_log(mv, [(95.0, {"txn": (app, 0)}),
                   (100.4, {"txn": (app, 1), "info": {"userMetadata": json.dumps({"airflow_backfill.watermarks": vector})}}),
                   (102.0, {"txn": (app, 2), "info": {"userMetadata": json.dumps(
                       {"airflow_backfill.watermarks": json.dumps({"a": 1, "b": 1})})}})])
    job = {"name": "join", "target": str(mv), "sources": {"a": {"table": str(left)}, "b": {"table": str(right)}}}
    figures = freshness([job], start=99.0, end=103.0, observed_until=110.0)
    assert (figures["samples"], figures["median_s"], figures["max_s"]) == (2, 0.7, 1.0)  # 0.4 s and 1 s


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
    assert round_costs(jobs) == {
        "plain": {"rounds": 4, "median_s": 0.35, "p90_s": 0.5, "plans": {"overwrite": 3, "replace": 1}},
        "join": {"rounds": 2, "median_s": 2.5, "p90_s": 3.0, "plans": {"overwrite": 1, "merge": 1}},
    }
