"""The `many_mvs` section: fifty MVs over live upstreams, kept fresh by the shared forward.

    python bench/run.py --sections many_mvs [--writers users|simulator] [--upstream-rows 20000]
                        [--many-mvs-window 120]

The upstreams and their writers (`bench/mv_workloads.py`): by default the users' four
upstreams, written by delta-rs and by Spark as users' services write (appends, scattered
updates and deletes, re-inserted keys, MERGE upserts; `bench/writers.py`), with the fifty
MVs of `bench/user_mvs.py`; or the project's simulator (`--writers simulator`). The
upstreams are created, every MV is backfilled (snapshot and catch-up in one set-up
process, timed), the writers start, then `spark-submit spark_jobs/shared_forward.py`
keeps the MVs fresh as the shared forward's task runs it. Over a window after a warm-up:

- freshness of every MV end to end: each base-upstream commit to the first MV commit that
  reflects it, through MV-over-MV chains and joins' vectors (`bench/mv_freshness.py`);
  per kind, and the worst MVs;
- rounds: per kind, their seconds and plans (the state files' last 20, and every round of
  the window in the forward's log), the upstream key checks' seconds (`bench/key_check_probe.py`),
  the rounds that rewrote a whole MV and the rows rounds wrote (`bench/mv_writes.py`);
- resident memory (PSS) and CPU of the forward's process tree; whether the JVM's code
  cache filled, and when;

then the same window while a 51st MV backfills TPC-H `lineitem`. After both: feed rows
per changed row along each link of the chains (`bench/chain_feeds.py`), a plain Spark
recompute of one MV of each kind (`bench/kind_recomputes.py`), every MV exact at its
last watermark and, up to `--exact-every-version-rows` rows an upstream, every committed
version in the window of a sample of each kind (`bench/exactness.py`); an idle single-MV
forward and one started per epoch (the alternatives), and Airflow's own processes' memory.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from airflow_backfill.shared_forward import DEFAULT_WORKERS
from bench import forward_log, kind_recomputes, mv_writes, writer_summary
from bench.airflow_memory import airflow_stack_memory
from bench.measure import median, percentile
from bench.mv_freshness import freshness
from bench.mv_kinds import KINDS, kinds_of
from bench.mv_workloads import Workload, env_with_checkout, module
from bench.tree_sampler import TreeSampler

PROBE_DIR = Path(__file__).resolve().parent / "forward_probe"


@dataclass(frozen=True)
class ManyMvsSettings:
    work_dir: str
    workload: Workload = field(default_factory=Workload)
    mvs: int = 50
    window_s: float = 120.0
    warm_up_s: float = 45.0
    workers: int = DEFAULT_WORKERS
    parallelism: int = 2
    forward_java_options: str = ""
    """JVM options added to the shared forward driver's documented ones (a diagnostic run;
    empty: exactly as the docs and the operator start it)."""
    exact_sample: int = 2
    """MVs of each kind whose every version in the window is checked."""
    exact_every_version_rows: int = 20_000
    """Check every version only up to this many rows an upstream."""


def write_job_folder(folder: Path, jobs: list[dict[str, Any]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for job in jobs:
        (folder / f"{job['name']}.yaml").write_text(yaml.safe_dump(job, sort_keys=False))




def spark_submit(script: str, args: list[str], log: Path, java_options: str = "") -> subprocess.Popen:
    """A spark_jobs entry point as its operator submits it (Delta's jars, local master; the
    shared forward's driver with the quick JIT compiler, `SharedForwardOperator`'s default,
    plus `java_options`, and the key-check probe on its Python path)."""
    from airflow_backfill.engine.delta.jars import delta_spark_conf
    from airflow_backfill.engine.launch.jit import DRIVER_DEFAULT_JAVA_OPTIONS, QUICK_JIT_OPTIONS

    conf = delta_spark_conf()
    env = {**env_with_checkout(), "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    if script == "shared_forward.py":
        conf[DRIVER_DEFAULT_JAVA_OPTIONS] = " ".join(filter(None, [QUICK_JIT_OPTIONS, java_options]))
        env["PYTHONPATH"] = os.pathsep.join([str(PROBE_DIR), env["PYTHONPATH"]])
    command = ["spark-submit", "--master", "local[2]"]
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    root = Path(__file__).resolve().parents[1]
    command += [str(root / "spark_jobs" / script), *args]
    with open(log, "w") as output:
        return subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def round_costs(jobs: list[dict[str, Any]], kinds: dict[str, str]) -> dict[str, Any]:
    """Per kind of MV: the seconds of the rounds each MV's state file keeps (its last 20,
    `round_costs`), median and p90, and how many took each plan. A join keeps its whole
    round (`join round`) beside its write's plan: the seconds are the whole round's."""
    from airflow_backfill.engine import job_state
    from airflow_backfill.engine.planning.round_plan import JOIN_ROUND
    from airflow_backfill.engine.rounds.plan_choice import ROUND_COSTS

    found_by_kind: dict[str, dict[str, Any]] = {}
    for job in jobs:
        kept = job_state.read_state(job["target"]).get(ROUND_COSTS, [])
        whole = [observed for observed in kept if observed["plan"] == JOIN_ROUND] or kept
        found = found_by_kind.setdefault(kinds[job["name"]], {"seconds": [], "plans": {}})
        found["seconds"] += [float(observed["seconds"]) for observed in whole]
        for observed in kept:
            if observed["plan"] != JOIN_ROUND:
                found["plans"][observed["plan"]] = found["plans"].get(observed["plan"], 0) + 1
    return {kind: {"rounds": len(found["seconds"]), "median_s": round(median(found["seconds"]), 3),
                   "p90_s": round(percentile(found["seconds"], 0.9), 3), "plans": found["plans"]}
            for kind, found in sorted(found_by_kind.items()) if found["seconds"]}


def contained(measure: Callable[..., Any], *args: Any) -> dict[str, Any]:
    """One measurement; its failure is reported in its place, the section's other figures kept."""
    try:
        return dict(measure(*args))
    except Exception as error:
        return {"status": f"failed: {type(error).__name__}: {str(error)[-400:]}"}


def stop(process: subprocess.Popen, timeout: float = 60.0) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


def measured_window(settings: ManyMvsSettings, jobs: list[dict[str, Any]], kinds: dict[str, str],
                    forward: subprocess.Popen, writers: list[subprocess.Popen],
                    extra: list[subprocess.Popen] | None = None) -> dict[str, Any]:
    """The window: the forward's memory and CPU (and the writers' CPU, which shares the
    machine), then, once the MVs had time to catch up with the window's last commits,
    every MV's freshness. Ends early if the forward exits."""
    sampler = TreeSampler([forward] if extra is None else [forward, *extra])
    writing = TreeSampler(list(writers))
    start = time.time()
    deadline = time.monotonic() + settings.window_s
    while time.monotonic() < deadline and forward.poll() is None:
        time.sleep(1.0)
    end = time.time()
    usage, writer_usage = sampler.stop(), writing.stop()
    if forward.poll() is None:  # commits in the last seconds are measured once the MVs caught up with them
        time.sleep(min(30.0, settings.window_s / 4))
    return {**usage, "writers_cpu_cores": writer_usage["cpu_cores"], "writers_pss_peak_mib": writer_usage["pss_peak_mib"],
            "window": [round(start, 3), round(end, 3)],
            "freshness": freshness(jobs, kinds, start, end, observed_until=time.time())}


def single_mv_forward(settings: ManyMvsSettings, job: dict[str, Any], work: Path) -> dict[str, Any]:
    """Today's forward task for one MV: its idle resident memory, then one started per epoch."""
    job_file = work / "single.yaml"
    job_file.write_text(yaml.safe_dump(job))
    idle = spark_submit("forward.py", ["--job", str(job_file), "--parallelism", "1"], work / "single_forward.log")
    sampler = TreeSampler([idle])
    time.sleep(60.0)
    usage = sampler.stop()
    stop(idle)
    started = time.monotonic()
    once = spark_submit("forward.py", ["--job", str(job_file), "--parallelism", "1", "--max-epochs", "1"],
                        work / "forward_once.log")
    peak = TreeSampler([once])
    try:
        once.wait(600)
    except subprocess.TimeoutExpired:
        stop(once)
    run = peak.stop()
    return {"idle_rss_mib": usage["rss_mean_mib"], "idle_cpu_cores": usage["cpu_cores"],
            "per_commit_run_s": round(time.monotonic() - started, 2), "per_commit_rss_peak_mib": run["rss_peak_mib"],
            "per_commit_exit": once.returncode}


def with_tpch_backfill(settings: ManyMvsSettings, jobs: list[dict[str, Any]], kinds: dict[str, str],
                       forward: subprocess.Popen, writers: list[subprocess.Popen], lineitem: str,
                       work: Path) -> dict[str, Any]:
    """The window again while a 51st MV (stateless, over TPC-H lineitem) runs its snapshot
    and catch-up as spark-submits, as its DAG would."""
    job = {"name": "tpch_new_mv", "source": lineitem, "target": str(work / "lake" / "tpch_new_mv"),
           "query": ("SELECT l_orderkey, l_linenumber, l_extendedprice * (1 - l_discount) AS revenue, l_shipdate "
                     "FROM source WHERE l_returnflag <> 'R'"),
           "primary_key": ["l_orderkey", "l_linenumber"], "backfill_parallelism": 2, "parallelism": 1}
    job_file = work / "tpch_new_mv.yaml"
    job_file.write_text(yaml.safe_dump(job))
    started = time.monotonic()
    box: dict[str, Any] = {"processes": []}

    def backfill() -> None:
        for phase in ("snapshot.py", "catch_up.py"):
            process = spark_submit(phase, ["--job", str(job_file), "--parallelism", "2"], work / f"tpch_{phase}.log")
            box["processes"].append(process)
            box[phase] = process.wait(1800)
        box["seconds"] = round(time.monotonic() - started, 1)

    runner = threading.Thread(target=backfill)
    runner.start()
    time.sleep(2.0)
    figures = measured_window(settings, jobs, kinds, forward, writers, box["processes"])
    runner.join(1800)
    return {**figures, "new_mv_backfill_s": box.get("seconds"),
            "new_mv_exit_codes": [box.get("snapshot.py"), box.get("catch_up.py")]}


def timed(process: subprocess.Popen, timeout: float, what: str, log: Path) -> float:
    """Wait for a set-up process; its seconds (an error naming its log when it fails)."""
    started = time.monotonic()
    if process.wait(timeout) != 0:
        raise RuntimeError(f"{what} failed, see {log}")
    return round(time.monotonic() - started, 1)


def in_subprocess(name: str, spec: dict[str, Any], work: Path, timeout: float = 3600) -> dict[str, Any]:
    """Run `python -m bench.<name> SPEC OUT` (a measurement that needs its own process: a
    Spark session, or the tests' oracle) and read its result."""
    spec_path, out_path, log = work / f"{name}.spec.json", work / f"{name}.out.json", work / f"{name}.log"
    spec_path.write_text(json.dumps(spec))
    process = module(log, f"bench.{name}", str(spec_path), str(out_path))
    try:
        code = process.wait(timeout)
    except subprocess.TimeoutExpired:
        stop(process)
        code = -1
    if code != 0 or not out_path.exists():
        raise RuntimeError(f"bench.{name} exited {code}, see {log}")
    return json.loads(out_path.read_text())


def exact_sample(jobs: list[dict[str, Any]], kinds: dict[str, str], per_kind: int) -> list[str]:
    """`per_kind` MVs of each kind, spread over the kind's MVs in declaration order."""
    chosen = []
    for kind in KINDS:
        names = [job["name"] for job in jobs if kinds[job["name"]] == kind]
        step = max(1, len(names) // max(1, per_kind))
        chosen += names[::step][:per_kind]
    return chosen


def after_the_run(settings: ManyMvsSettings, jobs: list[dict[str, Any]], kinds: dict[str, str],
                  window: list[float], started: float, work: Path) -> dict[str, Any]:
    """The figures read once the forward stopped: the log's rounds, key checks and code
    cache, the MVs' writes (in the window, and over the forward's whole run: a slow forward
    completes few rounds in a window), feeds along the chains and exactness."""
    start, end = window
    text = (work / "shared_forward.log").read_text(errors="replace")
    every_version = (exact_sample(jobs, kinds, settings.exact_sample)
                     if settings.workload.rows <= settings.exact_every_version_rows else [])
    return {
        "logged_rounds": contained(forward_log.rounds, text, kinds, start, end),
        "key_checks": contained(forward_log.key_checks, text, kinds, start, end),
        "whole_run": {"logged_rounds": contained(forward_log.rounds, text, kinds),
                      "key_checks": contained(forward_log.key_checks, text, kinds),
                      "writes": contained(mv_writes.writes, jobs, kinds, started, time.time())},
        "code_cache": contained(forward_log.code_cache, text),
        "writes": contained(mv_writes.writes, jobs, kinds, start, end),
        "chain_feeds": contained(lambda: {"links": in_subprocess(
            "chain_feeds", {"jobs": jobs, "start": start, "end": end}, work)}),
        "exact": contained(in_subprocess, "exactness",
                           {"jobs": jobs, "every_version": every_version, "start": start, "end": end}, work),
    }


def run_many_mvs(settings: ManyMvsSettings, tpch_lineitem: str | None) -> dict[str, Any]:
    workload = settings.workload
    work = Path(settings.work_dir) / "many_mvs"
    lake = work / "lake"
    lake.mkdir(parents=True, exist_ok=True)
    jobs = workload.jobs(lake, settings.mvs)
    kinds = kinds_of(jobs)
    write_job_folder(work / "jobs", jobs)
    result: dict[str, Any] = {
        **asdict(workload), "mvs": len(jobs), "upstreams": len(workload.upstreams(lake)), "window_s": settings.window_s,
        "warm_up_s": settings.warm_up_s, "workers": settings.workers, "parallelism": settings.parallelism,
        "forward_java_options": settings.forward_java_options,
        "kinds": {kind: sum(found == kind for found in kinds.values()) for kind in KINDS}}
    try:
        result["create_s"] = timed(workload.create(lake, work / "create.log"), 3600, "creating the upstreams",
                                   work / "create.log")
        # The folder backfilled as one, as docs/platform.md says (`airflow-backfill backfill --jobs-in`).
        result["backfill_all_s"] = timed(module(work / "backfill.log", "airflow_backfill.cli", "backfill", "--jobs-in",
                                                str(work / "jobs"), "--timeout", str(3 * 3600)), 3 * 3600 + 60,
                                         "the folder's backfill", work / "backfill.log")
    except RuntimeError as error:
        return {**result, "status": f"failed: {error}"}
    writers = workload.start_writers(lake, work)
    forward = spark_submit("shared_forward.py", [
        "--folder", str(work / "jobs"), "--parallelism", str(settings.parallelism),
        "--workers", str(settings.workers), "--poll-interval", "0.2",
        "--status-file", str(work / "status.json")], work / "shared_forward.log", settings.forward_java_options)
    started, forward_started = time.monotonic(), time.time()
    try:
        deadline = started + settings.warm_up_s
        while time.monotonic() < deadline and forward.poll() is None:
            time.sleep(1.0)
        result["steady"] = measured_window(settings, jobs, kinds, forward, writers)
        result["steady"]["rounds"] = contained(round_costs, jobs, kinds)
        result["writers_in_window"] = contained(writer_summary.summary, workload.upstreams(lake),
                                                *result["steady"]["window"])
        if tpch_lineitem is not None and forward.poll() is None:
            result["with_backfill"] = with_tpch_backfill(settings, jobs, kinds, forward, writers, tpch_lineitem, work)
        exit_code = forward.poll()
        result["forward_exit"] = ({"exited_by_itself": False} if exit_code is None else
                                  {"exited_by_itself": True, "code": exit_code,
                                   "after_s": round(time.monotonic() - started, 1)})
        stop(forward)
        # Beside the rounds, with the upstreams still committing: plain recomputes and the alternatives.
        result["plain_recompute"] = contained(kind_recomputes.side_by_side, jobs, kinds, work / "plain")
        result["single_mv_forward"] = contained(single_mv_forward, settings, jobs[0], work)
        if "idle_rss_mib" in result["single_mv_forward"]:
            result["single_mv_forward"]["projected_rss_gib_for_all"] = round(
                result["single_mv_forward"]["idle_rss_mib"] * len(jobs) / 1024, 2)
    finally:
        stop(forward)
        for writer in writers:
            stop(writer)
    status = json.loads((work / "status.json").read_text()) if (work / "status.json").exists() else {}
    result["member_failures"] = {name: member["failures"] for name, member in status.get("members", {}).items()
                                 if member.get("failures")}
    result.update(after_the_run(settings, jobs, kinds, result["steady"]["window"], forward_started, work))
    result["airflow"] = contained(airflow_stack_memory, work)
    _platform_totals(result)
    result["status"] = "measured"
    return result


def _platform_totals(result: dict[str, Any]) -> None:
    """The forward's memory plus Airflow's (and PostgreSQL's): the platform's."""
    airflow = result["airflow"]
    if "pss_peak_mib" not in airflow:
        return
    for window in ("steady", "with_backfill"):
        if window in result:
            result[f"platform_{window}_pss_peak_gib"] = round(
                (result[window]["pss_peak_mib"] + airflow["pss_peak_mib"]) / 1024, 2)
            result[f"platform_{window}_rss_peak_gib"] = round(
                (result[window]["rss_peak_mib"] + airflow["rss_peak_mib"]) / 1024, 2)


def many_mvs_section(work_dir: str, tables: Any, args: Any) -> dict[str, Any]:
    workload = Workload(writers=args.writers, rows=args.upstream_rows, seed=args.seed,
                        commits_per_second=args.commits_per_second, epoch_interval=args.epoch_interval)
    settings = ManyMvsSettings(work_dir=work_dir, workload=workload, mvs=args.mvs, window_s=args.many_mvs_window,
                               warm_up_s=args.many_mvs_warm_up, workers=args.many_mvs_workers,
                               forward_java_options=args.forward_java_options,
                               exact_every_version_rows=args.exact_every_version_rows)
    lineitem = tables.lineitem if tables is not None else None
    return run_many_mvs(settings, lineitem)
