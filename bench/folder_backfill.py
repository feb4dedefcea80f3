"""Fifty MVs backfilled from nothing: the folder as one application against a `spark-submit`
per MV's phase, side by side in one run.

    python bench/folder_backfill.py [--rows 150000] [--per-mv N] [--backfill-workers 2] [--keep]

The users' four upstreams (`bench/user_tables.py`: int, string and two-column keys) of
`--rows` rows each, created once (`python -m bench.writers create`), and the users' fifty
MVs over them (`bench/user_mvs.py`: stateless, aggregates, MVs over MVs, joins), written
twice as job folders whose MVs land in two lakes, each shape's MVs over MVs reading that
shape's own MVs. The upstreams stay still, so both shapes build the same MVs from the
same versions:

- **folder**: one `spark-submit spark_jobs/shared_forward.py --folder ... --until-backfilled`
  (what `backfill_dags`' default shape and `airflow-backfill backfill --jobs-in` run):
  every MV's snapshot and catch-up in one application, `--backfill-workers` at once, MVs
  over MVs after their source;
- **per MV**: what each job's DAG runs in the per-job shape, `spark_jobs/snapshot.py` then
  `spark_jobs/catch_up.py`, each its own `spark-submit`, in dependency order, one at a
  time (as a pool of one slot would). With `--per-mv N` only about N MVs spread over the
  mix (every k-th in dependency order, with the MVs they read) are built this way and the
  total is projected from their mean (said so in the result).

Then every MV of both lakes is checked at every commit it made against its query
recomputed on its upstreams as of that commit's watermark (`tests/oracle.py`). The run's
JSON is recorded by `bench/run_record.py` (`bench/table.py` reads it).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python bench/folder_backfill.py` puts bench/, not the checkout, on the path
    sys.path.insert(0, str(ROOT))

from bench import run_record  # noqa: E402
from bench.many_mvs import spark_submit, timed, write_job_folder  # noqa: E402
from bench.mv_workloads import Workload, env_with_checkout  # noqa: E402
from bench.user_mvs import user_mv_declarations  # noqa: E402
from bench.user_tables import TABLES  # noqa: E402

TARGET_SECONDS = 180.0
"""Fifty MVs of about 150 k rows per upstream built in at most 3 minutes (issue 85)."""


def shape_jobs(lake: Path, upstreams: Path) -> list[dict[str, Any]]:
    """The fifty jobs with their MVs in `lake` and their upstreams read from `upstreams`
    (the shared ones); an MV over an MV reads `lake`'s. In dependency order."""
    def shared(uri: str) -> str:
        return str(upstreams / Path(uri).name) if Path(uri).name in TABLES else uri

    jobs = user_mv_declarations(str(lake))
    for job in jobs:
        if "source" in job:
            job["source"] = shared(job["source"])
        for source in job.get("sources", {}).values():
            source["table"] = shared(source["table"])
    return jobs


def per_mv_sample(jobs: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """About `count` MVs spread over the mix (every k-th in dependency order) and the MVs
    they read, in dependency order: all of them when `count` is their number."""
    chosen = {job["target"] for job in jobs[::max(1, len(jobs) // count)][:count]}
    for job in reversed(jobs):  # an MV's sources come before it
        if job["target"] in chosen:
            chosen.update([job.get("source", ""), *(source["table"] for source in job.get("sources", {}).values())])
    return [job for job in jobs if job["target"] in chosen]


def run_folder(folder: Path, log: Path, backfill_workers: int) -> float:
    started = time.monotonic()
    process = spark_submit("shared_forward.py", ["--folder", str(folder), "--until-backfilled", "--parallelism", "2",
                                                 "--backfill-workers", str(backfill_workers), "--workers", "2",
                                                 "--rescan-interval", "5", "--max-seconds", "3600"], log)
    code = process.wait()
    if code != 0:
        raise RuntimeError(f"the folder's backfill exited {code}; see {log}")
    return time.monotonic() - started


def run_per_mv(folder: Path, jobs: list[dict[str, Any]], logs: Path) -> list[float]:
    """Each MV's snapshot then catch-up, each a spark-submit; the seconds per MV."""
    seconds = []
    for job in jobs:
        started = time.monotonic()
        for phase in ("snapshot", "catch_up"):
            log = logs / f"{job['name']}.{phase}.log"
            code = spark_submit(f"{phase}.py", ["--job", str(folder / f"{job['name']}.yaml"), "--parallelism", "2"],
                                log).wait()
            if code != 0:
                raise RuntimeError(f"{phase} of {job['name']} exited {code}; see {log}")
        seconds.append(time.monotonic() - started)
    return seconds


CHECK = """
import json, sys
sys.path.insert(0, sys.argv[2])
from oracle import assert_every_commit_matches, assert_every_join_commit_matches
failures, commits = {}, 0
for job in json.loads(open(sys.argv[1]).read()):
    app_id = "airflow_backfill/" + job["name"]
    try:
        if "sources" in job:
            upstreams = {name: up["table"] for name, up in job["sources"].items()}
            commits += len(assert_every_join_commit_matches(upstreams, job["target"], job["query"], app_id))
        else:
            commits += assert_every_commit_matches(job["source"], job["target"], job["query"], app_id)
    except Exception as error:  # an AssertionError: a commit not exact; another: the MV could not be read
        failures[job["name"]] = f"{type(error).__name__}: {error}"[:300]
print(json.dumps({"failures": failures, "commits": commits}))
"""


def check_every_commit(jobs: list[dict[str, Any]], log: Path) -> dict[str, Any]:
    spec = log.with_suffix(".jobs.json")
    spec.write_text(json.dumps(jobs))
    completed = subprocess.run([sys.executable, "-c", CHECK, str(spec), str(ROOT / "tests")], capture_output=True,
                               text=True, env=env_with_checkout(), timeout=3600)
    log.write_text(completed.stdout + completed.stderr)
    if completed.returncode != 0:
        return {"status": f"failed: the check exited {completed.returncode}, see {log}"}
    found = json.loads(completed.stdout.strip().splitlines()[-1])
    return {"checked": len(jobs), "exact": len(jobs) - len(found["failures"]), "commits": found["commits"],
            "failures": found["failures"]}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python bench/folder_backfill.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=150_000, help="rows of each upstream")
    parser.add_argument("--per-mv", type=int, default=None, metavar="N",
                        help="build only about N MVs spread over the mix the per-MV way and project the total "
                             "(default: all)")
    parser.add_argument("--backfill-workers", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="keep the work folder (upstreams, MVs, logs)")
    parser.add_argument("--output", default=None,
                        help="JSON result file (default: bench/results/<date>-<time>-<commit>-folder_backfill.json)")
    args = parser.parse_args(argv)
    if args.rows < 1 or (args.per_mv is not None and args.per_mv < 1):
        parser.error("--rows and --per-mv must be 1 or more")
    meta = {**run_record.run_meta("folder_backfill", "folder_backfill.py", argv), "quick": args.rows < 150_000}
    run_started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="folder-backfill-bench-"))
    try:
        logs, upstreams = work / "logs", work / "upstreams"
        logs.mkdir()
        workload = Workload(rows=args.rows)
        create_s = timed(workload.create(upstreams, logs / "create.log"), 3600, "creating the upstreams",
                         logs / "create.log")
        shapes = {shape: shape_jobs(work / shape, upstreams) for shape in ("folder", "per_mv")}
        for shape, jobs in shapes.items():
            write_job_folder(work / f"{shape}_jobs", jobs)
        mvs = len(shapes["folder"])
        folder_seconds = run_folder(work / "folder_jobs", logs / "folder.log", args.backfill_workers)
        per_mv_jobs = per_mv_sample(shapes["per_mv"], args.per_mv or mvs)
        per_mv = run_per_mv(work / "per_mv_jobs", per_mv_jobs, logs)
        per_mv_mean = sum(per_mv) / len(per_mv)
        per_mv_total = sum(per_mv) if len(per_mv) == mvs else per_mv_mean * mvs
        result = {
            "meta": meta, "mvs": mvs, "mix": "users", "rows_per_upstream": args.rows, "upstreams": len(TABLES),
            "create_s": create_s, "backfill_workers": args.backfill_workers,
            "folder_seconds": round(folder_seconds, 1),
            "per_mv_seconds": round(per_mv_total, 1),
            "per_mv_measured": len(per_mv), "per_mv_projected": len(per_mv) < mvs,
            "per_mv_mean_s": round(per_mv_mean, 2),
            "per_mv_each_s": {job["name"]: round(seconds, 1) for job, seconds in zip(per_mv_jobs, per_mv, strict=True)},
            "speedup": round(per_mv_total / folder_seconds, 2),
            "target_s": TARGET_SECONDS,
            "exact_folder": check_every_commit(shapes["folder"], logs / "check_folder.log"),
            "exact_per_mv": check_every_commit(per_mv_jobs, logs / "check_per_mv.log"),
        }
        result["meta"] = run_record.finish_meta(meta, time.monotonic() - run_started)
        print(json.dumps(result, indent=2))
        print(f"wrote {run_record.write_result(result, args.output)}")
        exact = result["exact_folder"].get("exact") == mvs
        return 0 if exact and folder_seconds <= TARGET_SECONDS else 1
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
