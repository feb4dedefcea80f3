"""The `many_mvs` section: fifty MVs over five live upstreams, kept fresh by the shared forward.

    python bench/run.py --sections many_mvs [--mvs 50] [--many-mvs-window 120]

Five `orders` upstreams (the project's simulator), each committing one epoch about once a
second from a writer process of their own. A folder of job files: 60 % stateless MVs,
30 % aggregates (a third of them over a stateless MV: MV-on-MV) and 10 % joins of two
upstreams. Every MV is backfilled first (snapshot and catch-up in one set-up process, as
their DAGs would), then `spark-submit spark_jobs/shared_forward.py` keeps them all fresh,
as the shared forward's task runs it. Measured over a window:

- the seconds of each kind of MV's rounds (the last ones its state file keeps) and the
  plans they took;
- resident memory of every process of the shared forward (spark-submit, the driver JVM,
  the Python driver), sampled every second: the peak and the mean;
- its CPU: CPU seconds over the window's seconds (cores busy);
- freshness of each MV: for every upstream commit in the window, the first MV commit
  that reflects it, minus the upstream commit's time (an MV over an MV against that
  MV's commits, a join against each of its upstreams); median and p95 over all MVs;

then the same window while a 51st MV backfills TPC-H `lineitem` (snapshot and catch-up,
each its own `spark-submit` at backfill parallelism 2, as its DAG runs them). After both,
every MV is checked exact at its last watermark by recomputing its query on its upstream
as of that version, and the alternatives are measured for the same MVs: one idle
single-MV `forward` (`spark_jobs/forward.py`, today's task per MV: its resident memory,
times the MV count for the projection) and a `forward --max-epochs 1` started for one new
epoch (the floor of a forward run per upstream commit: launch to commit).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from airflow_backfill.shared_forward import DEFAULT_WORKERS
from bench.measure import median, percentile

UPSTREAMS = 5
UPSTREAM_ROWS = 20_000
STATUSES = ("pending", "shipped", "delivered", "cancelled")


@dataclass(frozen=True)
class ManyMvsSettings:
    work_dir: str
    mvs: int = 50
    window_s: float = 120.0
    warm_up_s: float = 45.0
    epoch_interval: float = 1.0
    workers: int = DEFAULT_WORKERS
    parallelism: int = 2
    seed: int = 1


def mv_declarations(count: int, lake: str) -> list[dict[str, Any]]:
    """`count` jobs: 60 % stateless, 30 % aggregates (a third over stateless MVs), 10 % joins."""
    joins = max(1, count // 10) if count >= 5 else 0
    aggregates = max(1, (count * 3) // 10)
    stateless = max(1, count - joins - aggregates)
    upstream = [f"{lake}/upstream_{index}" for index in range(UPSTREAMS)]
    jobs: list[dict[str, Any]] = []
    for index in range(stateless):
        status = STATUSES[index % len(STATUSES)]
        jobs.append({
            "name": f"plain_{index}", "source": upstream[index % UPSTREAMS], "target": f"{lake}/plain_{index}",
            "query": (f"SELECT order_id, customer_id, status, amount * quantity AS total FROM source "
                      f"WHERE status <> '{status}'"),
            "primary_key": ["order_id"],
        })
    over_mvs = aggregates // 3
    for index in range(aggregates):
        over_mv = index < over_mvs
        source = f"{lake}/plain_{index % stateless}" if over_mv else upstream[index % UPSTREAMS]
        value = "total" if over_mv else "amount * quantity"
        group = "status" if index % 2 else "customer_id % 50"
        jobs.append({
            "name": f"agg_{index}", "source": source, "target": f"{lake}/agg_{index}",
            "query": (f"SELECT {group} AS bucket, COUNT(*) AS orders, SUM({value}) AS revenue FROM source "
                      f"GROUP BY {group}"),
            "primary_key": ["order_id"],
        })
    for index in range(joins):
        left, right = upstream[index % UPSTREAMS], upstream[(index + 1) % UPSTREAMS]
        jobs.append({
            "name": f"join_{index}", "target": f"{lake}/join_{index}",
            "sources": {"a": {"table": left, "primary_key": ["order_id"]},
                        "b": {"table": right, "primary_key": ["order_id"]}},
            "query": ("SELECT a.order_id, a.status, a.amount, b.status AS other_status, b.amount AS other_amount "
                      "FROM a JOIN b ON a.order_id = b.order_id"),
        })
    for job in jobs:
        job.update(backfill_parallelism=2, parallelism=1, lag_threshold=0, poll_interval=0.5)
    return jobs


def write_job_folder(folder: Path, jobs: list[dict[str, Any]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for job in jobs:
        (folder / f"{job['name']}.yaml").write_text(yaml.safe_dump(job, sort_keys=False))


def env_with_checkout() -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}


def python(code: str, log: Path, *args: str) -> subprocess.Popen:
    with open(log, "w") as output:
        return subprocess.Popen([sys.executable, "-c", code, *args], stdout=output, stderr=subprocess.STDOUT,
                                env=env_with_checkout(), start_new_session=True)


CREATE_UPSTREAMS = """
import sys
from airflow_backfill.simulator import create_orders_table
for index, uri in enumerate(sys.argv[2:]):
    create_orders_table(uri, int(sys.argv[1]), seed=index)
"""

WRITER = """
import random, sys, time
from airflow_backfill.simulator import commit_epoch
interval, uris = float(sys.argv[1]), sys.argv[2:]
rng = random.Random(7)
next_at = time.monotonic()
while True:
    for uri in uris:
        commit_epoch(uri, rng, inserts=20, updates=20, deletes=2)
    next_at += interval
    time.sleep(max(0.0, next_at - time.monotonic()))
"""

BACKFILL_ALL = """
import sys
from airflow_backfill.engine.spark_session import build_spark_session
from airflow_backfill.engine.phases.catch_up import run_catch_up
from airflow_backfill.engine.phases.snapshot import run_snapshot
from airflow_backfill.job_folder import load_job_folder
folder = load_job_folder(sys.argv[1])
assert not folder.errors, folder.errors
spark = build_spark_session("bench:many_mvs:backfill", 2)
done = set()
pending = list(folder.jobs)
while pending:
    for entry in list(pending):
        if all(up.name in done for up in folder.upstream_jobs(entry)):
            run_snapshot(spark, entry.job)
            run_catch_up(spark, entry.job)
            done.add(entry.name)
            pending.remove(entry)
            print("backfilled", entry.name, flush=True)
spark.stop()
"""


def spark_submit(script: str, args: list[str], log: Path) -> subprocess.Popen:
    """A spark_jobs entry point as its operator submits it (Delta's jars, local master; the
    shared forward's driver with the quick JIT compiler, `SharedForwardOperator`'s default)."""
    from airflow_backfill.engine.delta.jars import delta_spark_conf
    from airflow_backfill.engine.launch.jit import DRIVER_DEFAULT_JAVA_OPTIONS, QUICK_JIT_OPTIONS

    conf = delta_spark_conf()
    if script == "shared_forward.py":
        conf[DRIVER_DEFAULT_JAVA_OPTIONS] = QUICK_JIT_OPTIONS
    command = ["spark-submit", "--master", "local[2]"]
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    root = Path(__file__).resolve().parents[1]
    command += [str(root / "spark_jobs" / script), *args]
    env = {**env_with_checkout(), "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    with open(log, "w") as output:
        return subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env, start_new_session=True)


class TreeSampler:
    """Resident memory and CPU of process trees, sampled every second.

    Resident memory is summed two ways: RSS counts the pages that forked processes share
    (Airflow's LocalExecutor workers, the API server's worker) once per process, so its sum
    overstates; PSS divides each shared page among the processes that map it, so its sum
    is the memory the tree really holds."""

    def __init__(self, roots: list[Any]) -> None:
        import psutil

        self.psutil = psutil
        self.popens = roots  # may grow while sampled (a backfill's second phase)
        self.samples: list[int] = []
        self.pss_samples: list[int] = []
        self.process_counts: list[int] = []
        self.cpu_start = self.cpu_seconds()
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def processes(self) -> list[Any]:
        found = []
        for popen in list(self.popens):
            try:
                root = self.psutil.Process(popen.pid)
                found += [root, *root.children(recursive=True)]
            except self.psutil.NoSuchProcess:
                continue
        return found

    def cpu_seconds(self) -> float:
        total = 0.0
        for process in self.processes():
            try:
                times = process.cpu_times()
                total += times.user + times.system
            except self.psutil.NoSuchProcess:
                continue
        return total

    def sample(self) -> None:
        rss = pss = count = 0
        for process in self.processes():
            try:
                memory = process.memory_full_info()
            except (self.psutil.NoSuchProcess, self.psutil.AccessDenied):
                continue
            rss += memory.rss
            pss += getattr(memory, "pss", memory.rss)
            count += 1
        self.samples.append(rss)
        self.pss_samples.append(pss)
        self.process_counts.append(count)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self.sample()

    def stop(self) -> dict[str, Any]:
        cpu = self.cpu_seconds() - self.cpu_start
        seconds = time.monotonic() - self.started
        self._stop.set()
        self._thread.join()
        mib = [sample / 2**20 for sample in self.samples] or [0.0]
        pss = [sample / 2**20 for sample in self.pss_samples] or [0.0]
        return {"pss_peak_mib": round(max(pss), 1), "pss_mean_mib": round(sum(pss) / len(pss), 1),
                "rss_peak_mib": round(max(mib), 1), "rss_mean_mib": round(sum(mib) / len(mib), 1),
                "processes": max(self.process_counts or [0]),
                "cpu_cores": round(cpu / seconds, 3) if seconds else None, "seconds": round(seconds, 1)}


def log_commits(uri: str) -> list[dict[str, Any]]:
    """(version, timestamp ms, app transactions, userMetadata) of every commit, read from the
    log's JSON files (cheaper than loading each version)."""
    commits = []
    log_dir = Path(uri) / "_delta_log"
    for path in sorted(log_dir.glob("*.json")):
        if not path.stem.isdigit():
            continue
        entry: dict[str, Any] = {"version": int(path.stem), "txn": {}, "timestamp": None, "metadata": {}}
        for line in path.read_text().splitlines():
            action = json.loads(line)
            if "txn" in action:
                entry["txn"][action["txn"]["appId"]] = int(action["txn"]["version"])
            if "commitInfo" in action:
                info = action["commitInfo"]
                entry["timestamp"] = info.get("timestamp")
                if info.get("userMetadata"):
                    try:
                        entry["metadata"] = json.loads(info["userMetadata"])
                    except ValueError:
                        pass
        commits.append(entry)
    return commits


def reflected_versions(job: dict[str, Any], commits: list[dict[str, Any]]) -> list[tuple[str, int, float]]:
    """(upstream table, upstream version, MV commit time s) for each MV commit."""
    app_id = f"airflow_backfill/{job['name']}"
    found = []
    for commit in commits:
        if app_id not in commit["txn"] or commit["timestamp"] is None:
            continue
        at = commit["timestamp"] / 1000.0
        if "sources" in job:
            vector = commit["metadata"].get("airflow_backfill.watermarks")
            if vector is None:
                continue
            vector = json.loads(vector) if isinstance(vector, str) else vector
            for name, upstream in job["sources"].items():
                found.append((upstream["table"], int(vector[name]), at))
        else:
            found.append((job["source"], commit["txn"][app_id], at))
    return found


def freshness(jobs: list[dict[str, Any]], start: float, end: float, observed_until: float) -> dict[str, Any]:
    """Upstream commit to the first MV commit reflecting it, for upstream commits in [start, end).

    A commit that no MV commit reflected by `observed_until` counts with its lower bound,
    `observed_until` minus its commit time (leaving it out would flatter the figures).
    """
    upstream_times: dict[str, dict[int, float]] = {}
    lags: list[float] = []
    per_mv: dict[str, float] = {}
    missed = 0
    for job in jobs:
        reflected = reflected_versions(job, log_commits(job["target"]))
        mv_lags = []
        for table in {entry[0] for entry in reflected}:
            if table not in upstream_times:
                upstream_times[table] = {c["version"]: c["timestamp"] / 1000.0 for c in log_commits(table)
                                         if c["timestamp"] is not None}
            mine = sorted((version, at) for source, version, at in reflected if source == table)
            for version, committed_at in upstream_times[table].items():
                if not start <= committed_at < end:
                    continue
                first = next((at for reflected_version, at in mine if reflected_version >= version), None)
                if first is None:
                    missed += 1
                    first = observed_until
                mv_lags.append(max(0.0, first - committed_at))
        lags += mv_lags
        if mv_lags:
            per_mv[job["name"]] = round(median(mv_lags), 3)
    if not lags:
        return {"status": "failed: no upstream commit in the window was reflected", "missed": missed}
    worst = sorted(per_mv.items(), key=lambda item: -item[1])[:3]
    return {"median_s": round(median(lags), 3), "p95_s": round(percentile(lags, 0.95), 3),
            "max_s": round(max(lags), 3), "samples": len(lags), "not_reflected_counted_as_lower_bound": missed,
            "worst_mv_medians_s": dict(worst)}


def round_costs(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per kind of MV (plain, agg, join): the seconds of the rounds each MV's state file
    keeps (its last 20, `round_costs`), median and p90, and how many took each plan. A join
    keeps its whole round (`join round`) beside its write's plan: the seconds are the
    whole round's."""
    from airflow_backfill.engine import job_state
    from airflow_backfill.engine.planning.round_plan import JOIN_ROUND
    from airflow_backfill.engine.rounds.plan_choice import ROUND_COSTS

    kinds: dict[str, dict[str, Any]] = {}
    for job in jobs:
        kind = job["name"].rsplit("_", 1)[0]
        kept = job_state.read_state(job["target"]).get(ROUND_COSTS, [])
        whole = [observed for observed in kept if observed["plan"] == JOIN_ROUND] or kept
        found = kinds.setdefault(kind, {"seconds": [], "plans": {}})
        found["seconds"] += [float(observed["seconds"]) for observed in whole]
        for observed in kept:
            if observed["plan"] != JOIN_ROUND:
                found["plans"][observed["plan"]] = found["plans"].get(observed["plan"], 0) + 1
    return {kind: {"rounds": len(found["seconds"]), "median_s": round(median(found["seconds"]), 3),
                   "p90_s": round(percentile(found["seconds"], 0.9), 3), "plans": found["plans"]}
            for kind, found in sorted(kinds.items()) if found["seconds"]}


def check_exact(jobs: list[dict[str, Any]], log: Path) -> dict[str, Any]:
    """Each MV against its query recomputed on its upstream(s) as of its last watermark."""
    code = """
import json, sys
sys.path.insert(0, sys.argv[2])
from oracle import assert_mv_matches, expected_join_rows, mv_rows, mv_vector, assert_rows_match
from deltalake import DeltaTable
failures = {}
for job in json.loads(open(sys.argv[1]).read()):
    app_id = "airflow_backfill/" + job["name"]
    try:
        if "sources" in job:
            version = DeltaTable(job["target"]).version()
            vector = mv_vector(job["target"], app_id, version)
            upstreams = {name: up["table"] for name, up in job["sources"].items()}
            assert_rows_match(expected_join_rows(upstreams, vector, job["query"]), mv_rows(job["target"]))
        else:
            assert_mv_matches(job["source"], job["target"], job["query"], app_id)
    except AssertionError as error:
        failures[job["name"]] = str(error)[:300]
print(json.dumps(failures))
"""
    spec = log.with_suffix(".jobs.json")
    spec.write_text(json.dumps(jobs))
    tests = str(Path(__file__).resolve().parents[1] / "tests")
    completed = subprocess.run([sys.executable, "-c", code, str(spec), tests], capture_output=True, text=True,
                               env=env_with_checkout(), timeout=1800)
    log.write_text(completed.stdout + completed.stderr)
    if completed.returncode != 0:
        return {"status": f"failed: the check exited {completed.returncode}, see {log}"}
    failures = json.loads(completed.stdout.strip().splitlines()[-1])
    return {"checked": len(jobs), "exact": len(jobs) - len(failures), "failures": failures}


def contained(measure: Any, *args: Any) -> dict[str, Any]:
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


def measured_window(settings: ManyMvsSettings, jobs: list[dict[str, Any]], forward: subprocess.Popen,
                    extra: list[subprocess.Popen] | None = None) -> dict[str, Any]:
    sampler = TreeSampler([forward] if extra is None else [forward, *extra])
    start = time.time()
    deadline = time.monotonic() + settings.window_s
    while time.monotonic() < deadline and forward.poll() is None:
        time.sleep(1.0)
    end = time.time()
    usage = sampler.stop()
    # Commits in the last seconds of the window are measured once the MVs caught up with them.
    time.sleep(min(30.0, settings.window_s / 4))
    return {**usage, "window": [round(start, 3), round(end, 3)],
            "freshness": freshness(jobs, start, end, observed_until=time.time())}


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


def run_many_mvs(settings: ManyMvsSettings, tpch_lineitem: str | None) -> dict[str, Any]:
    work = Path(settings.work_dir) / "many_mvs"
    lake = work / "lake"
    lake.mkdir(parents=True, exist_ok=True)
    upstreams = [str(lake / f"upstream_{index}") for index in range(UPSTREAMS)]
    jobs = mv_declarations(settings.mvs, str(lake))
    write_job_folder(work / "jobs", jobs)
    result: dict[str, Any] = {"mvs": len(jobs), "upstreams": UPSTREAMS, "window_s": settings.window_s,
                              "workers": settings.workers, "parallelism": settings.parallelism,
                              "kinds": {kind: sum(job["name"].startswith(kind) for job in jobs)
                                        for kind in ("plain", "agg", "join")}}
    created = python(CREATE_UPSTREAMS, work / "create.log", str(UPSTREAM_ROWS), *upstreams)
    if created.wait(600) != 0:
        return {"status": f"failed: creating the upstreams, see {work / 'create.log'}"}
    started = time.monotonic()
    backfill = python(BACKFILL_ALL, work / "backfill.log", str(work / "jobs"))
    if backfill.wait(3600) != 0:
        return {"status": f"failed: the backfills, see {work / 'backfill.log'}"}
    result["backfill_all_s"] = round(time.monotonic() - started, 1)
    writer = python(WRITER, work / "writer.log", str(settings.epoch_interval), *upstreams)
    forward = spark_submit("shared_forward.py", [
        "--folder", str(work / "jobs"), "--parallelism", str(settings.parallelism),
        "--workers", str(settings.workers), "--poll-interval", "0.2",
        "--status-file", str(work / "status.json")], work / "shared_forward.log")
    try:
        time.sleep(settings.warm_up_s)
        result["steady"] = measured_window(settings, jobs, forward)
        result["steady"]["rounds"] = contained(round_costs, jobs)
        if tpch_lineitem is not None:
            result["with_backfill"] = with_tpch_backfill(settings, jobs, forward, tpch_lineitem, work)
        stop(forward)
        # The alternatives, on the same MVs with the upstreams still committing.
        result["single_mv_forward"] = contained(single_mv_forward, settings, jobs[0], work)
        if "idle_rss_mib" in result["single_mv_forward"]:
            result["single_mv_forward"]["projected_rss_gib_for_all"] = round(
                result["single_mv_forward"]["idle_rss_mib"] * len(jobs) / 1024, 2)
    finally:
        stop(forward)
        stop(writer)
    status = json.loads((work / "status.json").read_text()) if (work / "status.json").exists() else {}
    result["member_failures"] = {name: member["failures"] for name, member in status.get("members", {}).items()
                                 if member.get("failures")}
    result["exact"] = contained(check_exact, jobs, work / "check.log")
    result["airflow"] = contained(airflow_stack_memory, work)
    airflow = result["airflow"]
    if "pss_peak_mib" in airflow:
        for window in ("steady", "with_backfill"):
            if window in result:
                result[f"platform_{window}_pss_peak_gib"] = round(
                    (result[window]["pss_peak_mib"] + airflow["pss_peak_mib"]) / 1024, 2)
                result[f"platform_{window}_rss_peak_gib"] = round(
                    (result[window]["rss_peak_mib"] + airflow["rss_peak_mib"]) / 1024, 2)
    result["status"] = "measured"
    return result


AIRFLOW_DAG_FILE = """
from airflow_backfill.folder_dags import backfill_dags

backfill_dags({folder!r})
"""


def airflow_stack_memory(work: Path) -> dict[str, Any]:
    """Airflow's own processes with the folder's DAGs parsed (scheduler, DAG processor,
    triggerer, API server on PostgreSQL, DAGs paused so nothing runs): their resident
    memory over 30 s once every DAG is parsed."""
    tests = str(Path(__file__).resolve().parents[1] / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    from airflow_processes import airflow_env, run_airflow, start
    from airflow_processes import stop as stop_airflow
    from postgres import postgres_server

    from airflow_backfill.loopback import free_port

    home = work / "airflow"
    dags = home / "dags"
    dags.mkdir(parents=True, exist_ok=True)
    (dags / "jobs.py").write_text(AIRFLOW_DAG_FILE.format(folder=str(work / "jobs")))
    url = f"http://127.0.0.1:{free_port()}"
    with postgres_server() as database:
        env = {**airflow_env(home, dags, url, {"admin": "admin-secret"}, {"admin": "admin"}),
               "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": database.sqlalchemy_url,
               "AIRFLOW__CORE__EXECUTOR": "LocalExecutor", "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
               "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{url}/execution/"}
        migrated = run_airflow("db", "migrate", env=env, timeout=900)
        if migrated.returncode != 0:
            return {"status": f"failed: airflow db migrate: {migrated.stderr[-300:]}"}
        processes = [start(["api-server", "--host", "127.0.0.1", "--port", url.rsplit(":", 1)[1], "--workers", "1"],
                           env, home / "api-server.log"),
                     start(["scheduler", "--skip-serve-logs"], env, home / "scheduler.log"),
                     start(["dag-processor"], env, home / "dag-processor.log"),
                     start(["triggerer", "--skip-serve-logs"], env, home / "triggerer.log")]
        postmaster = database.postmaster_pid()
        try:
            time.sleep(90.0)  # start-up and the first parse of the folder's DAGs
            sampler = TreeSampler([*processes, *([_Pid(postmaster)] if postmaster is not None else [])])
            time.sleep(30.0)
            usage = sampler.stop()
        finally:
            stop_airflow(processes)
    return {**usage, "what": "api-server (1 worker), scheduler (LocalExecutor, default parallelism), "
            "dag-processor, triggerer and PostgreSQL's server, each with its children"}


@dataclass(frozen=True)
class _Pid:
    """A process the sampler follows that this process did not start."""

    pid: int


def with_tpch_backfill(settings: ManyMvsSettings, jobs: list[dict[str, Any]], forward: subprocess.Popen,
                       lineitem: str, work: Path) -> dict[str, Any]:
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
    figures = measured_window(settings, jobs, forward, box["processes"])
    runner.join(1800)
    return {**figures, "new_mv_backfill_s": box.get("seconds"),
            "new_mv_exit_codes": [box.get("snapshot.py"), box.get("catch_up.py")]}


def many_mvs_section(work_dir: str, tables: Any, args: Any) -> dict[str, Any]:
    settings = ManyMvsSettings(work_dir=work_dir, mvs=args.mvs, window_s=args.many_mvs_window,
                               epoch_interval=args.epoch_interval, workers=args.many_mvs_workers, seed=args.seed)
    random.seed(settings.seed)
    lineitem = tables.lineitem if tables is not None else None
    return run_many_mvs(settings, lineitem)
