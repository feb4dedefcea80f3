"""Section `submit`: catch-up as a DAG runs it, each side its own `spark-submit` (cold JVM).

A phase task starts a fresh JVM, which pays for class loading, code generation and
Delta's first snapshot before its first round does any work; an in-process benchmark
hides that. For the Q1 aggregate and the stateless MV: the MV is snapshotted by
`spark-submit spark_jobs/snapshot.py` (unmeasured), then `repeats` times one RF1 + RF2
pair is committed to lineitem, `spark-submit spark_jobs/catch_up.py` catches the MV up and
`spark-submit bench/plain_recompute.py` recomputes it as a user's plain job would, both
timed from the outside. Medians; the speed-up is plain over catch-up. The phases start on
the JVM class archive when one is built, and the catch-up with the JIT compiler the
catch-up operator would choose (`driver_jit: auto`), as the phase operators start them;
the plain job starts as a user's would, and outside `--quick` once more on the archive,
for the ratio of equal starts.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from typing import Any

import yaml

from airflow_backfill import tpch
from airflow_backfill.engine import job_state
from airflow_backfill.engine.delta.log import read_watermark
from airflow_backfill.engine.launch.class_archive import archive_launch
from airflow_backfill.engine.launch.jit import (
    DRIVER_DEFAULT_JAVA_OPTIONS,
    QUICK_JIT_OPTION,
    pending_change,
    quick_jit_suits,
)
from airflow_backfill.job_input import as_job
from bench.measure import median, stopwatch
from bench.workload import LINEITEM_KEY, QUERIES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_S = 20 * 60


def submit_env() -> dict[str, str]:
    """The environment a phase task gives spark-submit: the checkout's Spark settings
    (`SPARK_CONF_DIR`, as scripts/env.sh sets it) and this Python for the driver."""
    env = dict(os.environ)
    env.setdefault("SPARK_CONF_DIR", os.path.join(ROOT, "jars", "conf"))
    env.update({"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
                "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))})
    return env


def spark_submit(parallelism: int, application: str, *arguments: str, on_archive: bool = False,
                 quick_jit: bool = False) -> float:
    """Run one spark-submit to completion; its wall time in seconds (an error when it fails).

    `on_archive` starts the driver on the JVM class archive as the phase operators do
    (when `airflow-backfill jvm-archive` built one); `quick_jit` with the quick JIT
    compiler alone, as the catch-up operator does for a small change."""
    env = submit_env()
    launch = archive_launch(env) if on_archive else None
    options = launch.submit_arguments() if launch else []
    if quick_jit:
        options += ["--conf", f"{DRIVER_DEFAULT_JAVA_OPTIONS}={QUICK_JIT_OPTION}"]
    command = [os.path.join(os.path.dirname(sys.executable), "spark-submit"), "--master", f"local[{parallelism}]",
               *options, application, *arguments]
    if launch:
        env.update(launch.environment())
    with stopwatch() as elapsed:
        finished = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True,
                                  timeout=TIMEOUT_S, check=False)
    if finished.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:4])} failed ({finished.returncode}): {finished.stderr[-3000:]}")
    return round(elapsed(), 3)


def _job_file(work_dir: str, kind: str, tables: tpch.TpchTables, parallelism: int) -> tuple[str, str]:
    """A job file for the `kind` MV over lineitem; (its path, the MV's path)."""
    target = os.path.join(work_dir, "submit-mv", kind)
    job = {"name": f"bench_submit_{kind}", "source": tables.lineitem, "target": target, "query": QUERIES[kind],
           "primary_key": list(LINEITEM_KEY), "backfill_parallelism": parallelism, "lag_threshold": 0}
    path = os.path.join(work_dir, f"submit-{kind}.yaml")
    with open(path, "w") as handle:
        yaml.safe_dump(job, handle)
    return path, target


def submitted_catch_up(work_dir: str, tables: tpch.TpchTables, args: argparse.Namespace) -> dict[str, Any]:
    """Both MV kinds (the stateless one alone under `--quick`), each side its own spark-submit."""
    kinds = ("stateless",) if args.quick else ("aggregate", "stateless")
    return {"parallelism": args.backfill_parallelism, **{kind: _kind(work_dir, tables, args, kind) for kind in kinds}}


def _catch_up_jit_is_quick(job_file: str) -> bool:
    """The catch-up operator's `driver_jit: auto` choice for this job now."""
    job = as_job(job_file)
    watermark = read_watermark(job.target, job.app_id)
    return watermark is not None and quick_jit_suits(pending_change({"source": job.source}, {"source": watermark}))


def _kind(work_dir: str, tables: tpch.TpchTables, args: argparse.Namespace, kind: str) -> dict[str, Any]:
    """The phases on the JVM archive, as a DAG's tasks start them; the plain recompute as a
    user would start it, and (outside `--quick`, when there is an archive) on the archive
    too, so the ratio of equal starts is on record beside the user's."""
    parallelism = args.backfill_parallelism
    job_file, target = _job_file(work_dir, kind, tables, parallelism)
    phase = os.path.join(ROOT, "spark_jobs", "{}.py")
    on_archive = archive_launch(submit_env()) is not None
    spark_submit(parallelism, phase.format("snapshot"), "--job", job_file, on_archive=on_archive)
    plain = [os.path.join(ROOT, "bench", "plain_recompute.py"), "--query", QUERIES[kind],
             "--target", os.path.join(work_dir, "submit-plain", kind), "--source", tables.lineitem]
    runs = []
    for _ in range(args.repeats):
        tpch.insert_new_orders(tables, args.seed)
        version = tpch.delete_old_orders(tables, args.seed).lineitem_version
        quick_jit = _catch_up_jit_is_quick(job_file)
        catch_up_s = spark_submit(parallelism, phase.format("catch_up"), "--job", job_file, on_archive=on_archive,
                                  quick_jit=quick_jit)
        rounds = job_state.read_state(target).get("catch_up_rounds", [])
        run = {"catch_up_s": catch_up_s, "quick_jit": quick_jit,
               "plain_s": spark_submit(parallelism, *plain, "--version", str(version)),
               "round_s": round(sum(r.get("seconds", 0.0) for r in rounds), 3),
               "plans": [r.get("plan") for r in rounds]}
        if on_archive and not args.quick:
            run["plain_on_archive_s"] = spark_submit(parallelism, *plain, "--version", str(version), on_archive=True)
        runs.append(run)
    catch_up = median([r["catch_up_s"] for r in runs])
    plain_s = median([r["plain_s"] for r in runs])
    result = {"runs": runs, "jvm_archive": on_archive, "catch_up_median_s": round(catch_up, 3),
              "plain_median_s": round(plain_s, 3), "round_median_s": round(median([r["round_s"] for r in runs]), 3),
              "speedup": round(plain_s / catch_up, 2)}
    if all("plain_on_archive_s" in r for r in runs):
        plain_on_archive = median([r["plain_on_archive_s"] for r in runs])
        result.update(plain_on_archive_median_s=round(plain_on_archive, 3),
                      speedup_equal_start=round(plain_on_archive / catch_up, 2))
    return result
