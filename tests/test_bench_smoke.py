"""The benchmark harness: its pure parts (statistics, latencies, planning, the report)
and an end-to-end smoke run of `python bench/run.py --quick` at a tiny scale factor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import report  # noqa: E402
from bench.measure import MemorySampler, PhaseTimer, median, percentile  # noqa: E402
from bench.run import ChildRun, combine, plan_children  # noqa: E402
from bench.workload import freshness_latencies  # noqa: E402


def test_the_join_benchmark_takes_a_heap_size_and_refuses_anything_else() -> None:
    import argparse

    from bench.joins import driver_memory

    assert driver_memory("4g") == "4g" and driver_memory("512M") == "512m"
    for bad in ("4x", "0g", "4", "g", "4 g", "-1g"):
        with pytest.raises(argparse.ArgumentTypeError, match="no heap size"):
            driver_memory(bad)


def test_percentile_is_nearest_rank_and_median_is_the_middle() -> None:
    values = [float(v) for v in range(1, 21)]
    assert percentile(values, 0.95) == 19.0
    assert percentile(values, 1.0) == 20.0
    assert percentile([3.0], 0.95) == 3.0
    assert median([5.0, 1.0, 3.0]) == 3.0


def test_freshness_latency_is_first_mv_commit_at_or_past_the_epoch() -> None:
    upstream = [{"version": 5, "timestamp": 10_000}, {"version": 6, "timestamp": 11_000},
                {"version": 7, "timestamp": 12_000}]
    def metadata(epoch: str, phase: str = "forward") -> str:
        return json.dumps({"airflow_backfill.epoch": epoch, "airflow_backfill.phase": phase})

    mv = [
        {"version": 0, "timestamp": 9_000, "userMetadata": metadata("4", "snapshot")},
        {"version": 1, "timestamp": 12_500, "userMetadata": metadata("6")},  # reflects 5 and 6
        {"version": 2, "timestamp": 14_000, "userMetadata": metadata("7")},
        {"version": 3, "timestamp": 15_000},  # not an engine commit (maintenance)
        {"version": 4, "timestamp": 11_200, "userMetadata": json.dumps({"airflow_backfill.chunk": "9"})},
    ]
    assert freshness_latencies(upstream, mv, [5, 6, 7]) == [2.5, 1.5, 2.0]
    assert freshness_latencies(upstream, mv[:2], [5, 7]) == [2.5]  # 7 not reflected yet


def test_phase_timer_wraps_and_restores_module_functions() -> None:
    import types

    module = types.SimpleNamespace(step=lambda x: x * 2)
    original = module.step
    timer = PhaseTimer()
    with timer.wrapping(module, ["step", "missing"]):
        assert module.step(2) == 4
        assert module.step is not original
    assert module.step is original
    assert set(timer.take()) == {"step"}
    assert timer.take() == {}


def test_memory_sampler_keeps_a_section_peak_and_window_peaks() -> None:
    sampler = MemorySampler(interval=0.01)
    with sampler:
        with sampler.window() as peak:
            ballast = bytearray(64 * 1024 * 1024)
            ballast[::4096] = b"x" * len(ballast[::4096])  # touch the pages so they are resident
            sampler.sample()
            del ballast
        section = sampler.peaks_mib()
    assert peak["peak_rss_mib"] is not None and peak["peak_rss_mib"] >= 64
    assert peak["start_root_rss_mib"] is not None and peak["peak_root_rss_mib"] is not None
    assert peak["start_root_rss_mib"] + 60 <= peak["peak_root_rss_mib"], "the window's start is not its peak"
    assert section["peak_rss_mib"] is not None and section["peak_rss_mib"] >= peak["peak_rss_mib"]


def test_quick_plan_groups_by_parallelism_and_full_plan_isolates_sections() -> None:
    sections = ("snapshot_overhead", "scaling", "catch_up", "refresh", "freshness", "orchestration")
    quick = plan_children(sections, quick=True, backfill_parallelism=2)
    assert [(c.parallelism, c.sections) for c in quick] == [
        (2, ("snapshot_overhead", "catch_up", "refresh")), (1, ("scaling", "freshness")),
    ]
    full = plan_children(sections, quick=False, backfill_parallelism=2)
    assert [(c.parallelism, c.sections) for c in full] == [
        (2, ("snapshot_overhead",)), (1, ("scaling",)), (2, ("catch_up",)), (2, ("refresh",)),
        (1, ("freshness",)),
    ]
    alone = plan_children(("scaling",), quick=False, backfill_parallelism=2)
    assert [(c.parallelism, c.sections) for c in alone] == [(1, ("scaling",)), (2, ("scaling",))]


def test_combine_reuses_the_overhead_runs_for_scaling_in_quick_mode() -> None:
    backfill = ChildRun(2, ("snapshot_overhead",))
    backfill.results.update({
        "_session": {"start_s": 8.0},
        "snapshot_overhead": {"parallelism": 2, "memory": {"peak_rss_mib": 900.0, "peak_jvm_rss_mib": 700.0},
                              "stateless": {"status": "measured", "engine_s": [5.0, 6.0, 7.0],
                                            "engine_median_s": 6.0, "plain_median_s": 4.0}},
    })
    steady = ChildRun(1, ("scaling",))
    steady.results["scaling"] = {"parallelism": 1, "snapshot_median_s": 9.0, "plain_median_s": 7.0,
                                 "memory": {"peak_rss_mib": 800.0}}
    result = combine([backfill, steady])
    assert result["scaling"]["speedup"] == 1.5 and result["scaling"]["plain_speedup"] == 1.75
    assert set(result["memory"]) == {"snapshot_overhead p2", "scaling p1"}
    assert "_session" not in result


def test_report_says_missed_targets_and_unavailable_sections() -> None:
    result = {
        "meta": {"scale_factor": 0.01, "quick": True, "cpus": 2, "load_before": 0.5, "load_after": 1.0,
                 "seconds": 50.0},
        "snapshot_overhead": {"parallelism": 2, "stateless": {
            "status": "measured", "ratio": 1.45, "engine_median_s": 1.45, "plain_median_s": 1.0},
            "aggregate": {"status": "not supported yet: GROUP BY"}},
        "orchestration": {"status": "not available: airflow_backfill.task_group cannot be imported"},
        "memory": {"snapshot_overhead p2": {"peak_rss_mib": 900.0, "peak_jvm_rss_mib": 700.0}},
    }
    text = report.render(result)
    assert "1.45x" in text and "MISSED" in text
    assert "not supported yet" in text and "not available" in text
    assert report.markdown(result).startswith("| measurement |")


def test_report_compares_each_catch_up_with_the_plain_recompute_and_its_floor() -> None:
    result = {
        "meta": {"scale_factor": 1.0},
        "catch_up": {"shares": {"0.01": {"catch_up_s": 3.5, "plain_s": 7.0, "speedup": 2.0, "recompute_s": 9.0,
                                         "speedup_vs_snapshot": 2.57, "plans": ["replace"],
                                         "floor_s": {"feed": 0.5, "locate": 0.6, "commits": 0.4, "total": 1.5}},
                                "0.1": {"catch_up_s": 8.0, "plain_s": 7.0, "speedup": 0.88, "plans": ["recompute"]}},
                     "one_row": {"catch_up_s": 0.4, "plain_s": 4.0, "speedup": 10.0, "plans": ["replace"]}},
        "refresh": {"parallelism": 2, "aggregate": {"speedup": 2.8, "catch_up_median_s": 1.5, "plain_median_s": 4.2,
                                                    "speedup_vs_snapshot": 3.5, "floor_median_s": 0.7,
                                                    "refresh_pairs": [{"plans": ["incremental (state overwrite, mv overwrite)"]}]}},
    }
    rows = {row[0]: row for row in report.rows(result)}
    one_pct = rows["3. catch-up of 1.0% updated rows"]
    assert one_pct[1].startswith("2.00x (3.50 s vs plain 7.00 s; vs snapshot 2.57x; plan replace")
    assert "floor 1.50 s, so at most 4.7x" in one_pct[1] and one_pct[2:] == (">= 1.0x", "met")
    assert rows["3. catch-up of 10.0% updated rows"][2:] == (">= 1.0x", "MISSED")  # never slower than plain
    assert rows["3. catch-up of one updated row"][2:] == ("<= 0.5 s", "met")
    q1 = rows["3. Q1 aggregate: one RF1 + RF2 pair (p2)"]
    assert "plan incremental (state overwrite, mv overwrite)" in q1[1] and "at most 6.0x" in q1[1]
    assert q1[2:] == (">= 3.0x", "MISSED")


def _write_run(folder: Path, name: str, meta: dict, **sections: object) -> None:
    (folder / name).write_text(json.dumps({"meta": {"bench": "run", "command": "python bench/run.py",
                                                     "commit": "abc1234", "scale_factor": 1.0, **meta}, **sections}))


def test_the_table_shows_the_latest_full_run_of_each_rows_scale(tmp_path: Path) -> None:
    from bench import table

    refresh = {"aggregate": {"speedup": 4.0, "catch_up_median_s": 1.0, "plain_median_s": 4.0}}
    _write_run(tmp_path, "a.json", {"started": "2026-11-30T10:00:00+0000", "date": "2026-11-30"}, refresh=refresh)
    _write_run(tmp_path, "b.json", {"started": "2026-12-01T10:00:00+0000", "date": "2026-12-01", "commit": "def5678"},
               refresh={"aggregate": {"speedup": 2.5, "catch_up_median_s": 2.0, "plain_median_s": 5.0}})
    _write_run(tmp_path, "c.json", {"started": "2026-12-02T10:00:00+0000", "quick": True}, refresh=refresh)
    _write_run(tmp_path, "d.json", {"started": "2026-12-03T10:00:00+0000", "scale_factor": 10.0}, refresh=refresh)
    _write_run(tmp_path, "e.json", {"started": "2026-12-04T10:00:00+0000", "transcribed": "run Z"},
               freshness={"median_s": 0.9, "p95_s": 4.0})
    runs = table.load_runs(tmp_path)
    q1 = table.ROWS_BY_ANCHOR["round-q1"]
    run, figure = table.latest(q1, runs) or (None, None)
    assert run is not None and run.path.name == "b.json"  # c is --quick, d of SF 10
    assert figure == table.Figure("2.50x (2.00 s vs 5.00 s)", False)  # below the 3x target
    run, figure = table.latest(table.ROWS_BY_ANCHOR["round-q1-sf10"], runs) or (None, None)
    assert run is not None and run.path.name == "d.json" and figure is not None and figure.met is False
    rows = table.figures_table(runs).splitlines()
    q1_row = next(line for line in rows if 'id="round-q1"' in line)
    assert "| 2.50x (2.00 s vs 5.00 s) | no | `python bench/run.py` | def5678 | 2026-12-01 |" in q1_row
    freshness_row = next(line for line in rows if 'id="freshness"' in line)
    assert "| median 0.90 s, p95 4.00 s | no |" in freshness_row and "abc1234" + table.TRANSCRIBED_MARK in freshness_row
    assert "not measured yet" in next(line for line in rows if 'id="kafka"' in line)
    assert "(`--quick`: not in the table)" in table.history_table(runs)


def test_the_size_ratio_of_the_fifty_mvs_holds_only_under_a_like_write_load(tmp_path: Path) -> None:
    from bench import table

    def many(rows: int, median: float, p95: float, rate: float) -> dict:
        return {"status": "measured", "writers": "users", "rows": rows, "writers_in_window": {"commits_per_s": rate},
                "steady": {"freshness": {"median_s": median, "p95_s": p95, "max_s": p95, "samples": 10}}}

    _write_run(tmp_path, "small.json", {"started": "2026-12-01T10:00:00+0000"}, many_mvs=many(20_000, 8.0, 15.0, 1.6))
    _write_run(tmp_path, "large.json", {"started": "2026-12-02T10:00:00+0000"}, many_mvs=many(2_000_000, 10.0, 18.0, 0.24))
    ratio = table.ROWS_BY_ANCHOR["many-mvs-2m-vs-20k"]
    assert ratio.across is not None
    found = ratio.across(table.load_runs(tmp_path))
    assert found is not None
    run, figure = found
    assert run.path.name == "large.json" and figure.text.startswith("median 1.25x, p95 1.20x")
    assert figure.met is False and "not like for like" in figure.text  # 0.24 commits/s against 1.6
    _write_run(tmp_path, "large.json", {"started": "2026-12-02T10:00:00+0000"}, many_mvs=many(2_000_000, 10.0, 18.0, 1.5))
    found = ratio.across(table.load_runs(tmp_path))
    assert found is not None and found[1].met is True and "like for like" not in found[1].text


def test_the_table_refuses_a_page_without_its_markers(tmp_path: Path) -> None:
    from bench import table

    page = tmp_path / "page.md"
    with pytest.raises(ValueError, match="must hold the markers"):
        table.replaced("no markers here", "figures", "| x |", page)
    marked = f"before\n{table.marker('figures')}\nold\n{table.marker('figures', end=True)}\nafter\n"
    assert table.replaced(marked, "figures", "new", page) == marked.replace("\nold\n", "\nnew\n")


def test_a_runs_file_is_named_by_its_date_time_commit_and_benchmark(tmp_path: Path) -> None:
    from bench import run_record

    meta = run_record.run_meta("joins", "joins.py", ["--scale", "10", "--kinds", "q3 q3_rows"])
    assert meta["command"] == "python bench/joins.py --scale 10 --kinds 'q3 q3_rows'"
    path = run_record.write_result({"meta": {**meta, "started": "2026-12-01T09:05:00+0000"}},
                                   tmp_path / "x.json")
    assert json.loads(path.read_text())["meta"]["bench"] == "joins"
    named = run_record.result_path({"started": "2026-12-01T09:05:00+0000", "commit": "abc1234", "bench": "joins"},
                                   tmp_path)
    assert named == tmp_path / "2026-12-01-0905-abc1234-joins.json"


def _numbers(*values: object) -> bool:
    return all(isinstance(value, int | float) and not isinstance(value, bool) for value in values)


def quick_run(tmp_path: Path, sections: str) -> tuple[dict, str]:
    """`bench/run.py --quick` over `sections` at a tiny scale factor: its result and stdout."""
    output = tmp_path / "results.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    completed = subprocess.run(
        [sys.executable, "bench/run.py", "--scale", "0.002", "--quick", "--epochs", "4", "--repeats", "1",
         "--sections", sections, "--output", str(output), "--work-dir", str(tmp_path / "work")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
    )
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-4000:]
    result = json.loads(output.read_text())
    assert result["meta"]["scale_factor"] == 0.002 and result["meta"]["quick"] is True
    memory = result["memory"]
    assert all(_numbers(peak["peak_rss_mib"]) and peak["peak_rss_mib"] > 100 for peak in memory.values())
    return result, completed.stdout


@pytest.mark.e2e
@pytest.mark.timeout(660)
def test_quick_benchmark_reports_every_section(tmp_path: Path) -> None:
    """One run of every section (one TPC-H load and one JVM per parallelism, as
    `bench/run.py --quick` plans them), each section's figures checked in turn."""
    result, stdout = quick_run(tmp_path, "snapshot_overhead,scaling,freshness,orchestration,catch_up,refresh,submit")
    _check_snapshot_freshness_and_orchestration(result, stdout)
    _check_rounds_against_a_plain_recompute(result, stdout)
    _check_the_run_reaches_the_table(result, tmp_path / "results.json")


def _check_the_run_reaches_the_table(result: dict, path: Path) -> None:
    """The run says how to make it again, and bench/table.py reads its figures (a row of
    its scale factor, as a full run's would be; `--quick` runs stay out of the table)."""
    from bench import table

    meta = result["meta"]
    assert meta["bench"] == "run" and meta["command"].startswith("python bench/run.py --scale 0.002 --quick")
    assert len(meta["commit"]) == 7 and isinstance(meta["dirty"], bool) and meta["date"] == meta["started"][:10]
    runs = table.load_runs(path.parent)
    assert [run.path for run in runs] == [path]
    rows = [row for row in table.ROWS if row.bench == "run" and row.scale == 1.0]
    figures = {row.anchor: row.read(result) for row in rows}
    assert figures["round-stateless"] is not None and figures["round-one-row"] is not None
    assert figures["freshness"] is not None and figures["freshness"].text.startswith("median ")
    assert table.latest(rows[0], runs) is None  # quick, and of another scale: not a row's figure


def _check_snapshot_freshness_and_orchestration(result: dict, stdout: str) -> None:
    overhead = result["snapshot_overhead"]
    stateless = overhead["stateless"]
    assert len(stateless["engine_s"]) == len(stateless["plain_s"]) == 1
    assert _numbers(stateless["ratio"], stateless["engine_median_s"], stateless["plain_median_s"])
    unverified = overhead["stateless_unverified_key"]
    # Unverified, the step only logs that it skips the proof (under load that alone can
    # round to a millisecond); verified, it proves the key: more, in the same run.
    proved_s = stateless["engine_steps_median_s"]["_prove_key"]
    assert proved_s > 0.0
    assert unverified["engine_steps_median_s"]["_prove_key"] < proved_s
    aggregate = overhead["aggregate"]
    assert aggregate["status"] == "measured" and _numbers(aggregate["ratio"], aggregate["engine_median_s"])

    assert _numbers(result["scaling"]["speedup"], result["scaling"]["p1_median_s"], result["scaling"]["p2_median_s"],
                    result["scaling"]["plain_speedup"])
    freshness = result["freshness"]
    assert freshness["epochs"] == 4 and freshness["epochs_reflected"] == 4
    assert _numbers(freshness["median_s"], freshness["p95_s"]) and freshness["p95_s"] >= freshness["median_s"] > 0

    orchestration = result["orchestration"]
    assert _numbers(orchestration["wall_s"], orchestration["spark_s"], orchestration["overhead_s"])
    assert {"snapshot_overhead p2", "scaling p1", "freshness p1"} <= set(result["memory"])
    assert "snapshot overhead" in stdout and "freshness" in stdout


def _check_rounds_against_a_plain_recompute(result: dict, stdout: str) -> None:
    assert "newest" not in result["catch_up"]  # --quick: one share and the single row
    cases = [*result["catch_up"]["shares"].values(), result["catch_up"]["one_row"]]
    for case in cases:
        assert case["updated_rows"] >= 1 and case["plans"], case
        assert _numbers(case["speedup"], case["catch_up_s"], case["plain_s"], case["recompute_s"])
        assert case["speedup"] == round(case["plain_s"] / case["catch_up_s"], 3)
    assert result["catch_up"]["one_row"]["updated_rows"] == 1
    assert sorted(result["catch_up"]["shares"]) == ["0.01"]
    for share in ("0.01",):
        case = result["catch_up"]["shares"][share]
        assert _numbers(case["driver_python_peak_mib"]) and case["driver_python_peak_mib"] > 0
        assert 0 < case["driver_python_start_mib"] <= case["driver_python_peak_mib"]
        floor = case["floor_s"]
        assert abs(floor["total"] - (floor["feed"] + floor["locate"] + floor["commits"])) < 0.005 and floor["locate"] > 0
    assert result["catch_up"]["mv_files"] >= 1
    for kind in ("aggregate", "stateless"):
        refresh = result["refresh"][kind]
        assert len(refresh["refresh_pairs"]) == 1
        pair = refresh["refresh_pairs"][0]
        recomputed = all(plan.startswith("recompute") for plan in pair["plans"])
        assert pair["inserted_lineitems"] >= 1 and pair["deleted_lineitems"] >= 1
        assert pair["change_rows"] >= 2 or recomputed, pair  # a recompute chosen before the feed reads none
        assert _numbers(refresh["speedup"], refresh["catch_up_median_s"], refresh["plain_median_s"],
                        refresh["recompute_median_s"])
        assert pair["plans"], refresh
        floor = pair["floor_s"]
        assert 0 < floor["feed"] < floor["total"] and 0 < floor["commits"] < floor["total"], floor
        assert (floor["locate"] > 0) == (kind == "stateless"), floor
        assert refresh["ceiling_speedup"] == round(refresh["plain_median_s"] / refresh["floor_median_s"], 2)
        steps = pair["round_steps_s"]
        written = steps["write"] + steps[f"recompute_{kind}"]  # a pair may append, then recompute
        assert written > 0 and steps["apply_epochs"] >= written, (pair["plans"], steps)
    assert "aggregate" not in result["submit"]  # --quick submits the stateless MV alone
    for kind in ("stateless",):  # each side its own spark-submit, as a DAG runs it
        submitted = result["submit"][kind]
        assert len(submitted["runs"]) == 1 and submitted["runs"][0]["plans"], submitted
        assert submitted["runs"][0]["quick_jit"] is True  # one refresh pair: a small change
        assert submitted["speedup"] == round(submitted["plain_median_s"] / submitted["catch_up_median_s"], 2)
    assert {"catch_up p2", "refresh p2"} <= set(result["memory"])
    assert "refresh" in stdout


def test_the_event_log_reader_accounts_for_jobs_and_the_gaps_between_them(tmp_path: Path) -> None:
    from bench.event_log import read_events
    from bench.event_log import report as event_report

    events = [
        {"Event": "org.apache.spark.sql.execution.ui.SparkListenerSQLExecutionStart", "executionId": 3,
         "time": 1000, "description": "save at delta\nmore"},
        {"Event": "SparkListenerJobStart", "Job ID": 7, "Submission Time": 1_010, "Stage Infos": [
            {"Number of Tasks": 2}, {"Number of Tasks": 1}],
         "Properties": {"spark.sql.execution.id": "3", "callSite.short": "save at NativeMethodAccessorImpl.java:0"}},
        {"Event": "SparkListenerJobEnd", "Job ID": 7, "Completion Time": 1_510},
        {"Event": "SparkListenerJobStart", "Job ID": 8, "Submission Time": 2_010, "Stage Infos": [],
         "Properties": {"spark.job.description": "Delta: Compute snapshot"}},
        {"Event": "SparkListenerJobEnd", "Job ID": 8, "Completion Time": 2_260},
        {"Event": "SparkListenerJobStart", "Job ID": 9, "Submission Time": 2_300, "Stage Infos": [
            {"Number of Tasks": 4, "Stage Name": "$anonfun$recordDeltaOperationInternal$1 at DatabricksLogging.scala:128",
             "Details": "org.apache.spark.sql.delta.ScanWithDeletionVectors$.dvEnabledScanFor(PreprocessTableWithDVs.scala:90)"}],
         "Properties": {}},
        {"Event": "SparkListenerJobEnd", "Job ID": 9, "Completion Time": 2_310},
        {"Event": "org.apache.spark.sql.execution.ui.SparkListenerSQLExecutionEnd", "executionId": 3, "time": 1600},
    ]
    path = tmp_path / "app-1"
    path.write_text("\n".join(json.dumps(event) for event in events))
    jobs, executions = read_events(path)
    assert [job.seconds for job in jobs.values()] == [0.5, 0.25, 0.01] and jobs[7].tasks == 3
    assert jobs[7].cause == "Spark: save of a DataFrame"
    assert jobs[8].cause == "Delta: a new version's state rebuilt (its file list)"
    assert jobs[9].cause.startswith("Delta: files with deletion vectors")
    listing, summary = event_report(jobs, executions, 0, 2**62).split("\n\n")
    assert "save at NativeMethodAccessorImpl.java:0  [save at delta]" in listing
    assert "Delta: Compute snapshot" in listing
    assert listing.splitlines()[-1] == ("3 jobs over 1.300 s: jobs running 0.760 s, no job running 0.540 s "
                                        "(driver: planning, Delta's log, Python)")
    assert summary.splitlines()[1:] == [
        "    1   0.500  Spark: save of a DataFrame",
        "    1   0.250  Delta: a new version's state rebuilt (its file list)",
        "    1   0.010  Delta: files with deletion vectors, looked up at each plan of a scan",
    ]
    assert event_report(jobs, executions, 5_000, 6_000) == "no Spark job in the window"
