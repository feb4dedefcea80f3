"""What one shared-forward round costs per kind of MV, in one warm session.

    python bench/member_rounds.py [--rounds 8] [--mvs plain_0,agg_1,join_0]

The `many_mvs` section's simulator MVs (`bench/mv_workloads.py`: a stateless MV with a WHERE, an
aggregate with a SUM of a DOUBLE, a join of two upstreams) over its 20,000-row `orders`
upstreams, backfilled, then rounds run by `DeltaMember.run_round` as the shared forward
runs them: before each round every upstream commits one epoch (20 inserts, 20 updates, 2
deletes). For each MV, the medians over the rounds after the first two of the round's
seconds, the driver JVM's CPU seconds, the Python driver's CPU seconds (this process with
its threads: delta-rs and Arrow work included) and the py4j calls the round made. With fifty MVs
a turn of the shared forward is the sum of such rounds over its workers, so this is where
a change to the round shows first; run it from two work trees one after the other,
alternating, to compare commits (docs/benchmark-analyses.md).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python bench/member_rounds.py` puts bench/, not the checkout, on the path
    sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from bench import run_record  # noqa: E402
from bench.many_mvs import write_job_folder  # noqa: E402
from bench.mv_workloads import UPSTREAM_ROWS, mv_declarations  # noqa: E402

WARM_UP_ROUNDS = 2


class Py4jCalls:
    """Counts the commands this process sends to the JVM (py4j's `GatewayClient.send_command`)."""

    def __init__(self) -> None:
        from py4j.java_gateway import GatewayClient

        self.count = 0
        original = GatewayClient.send_command

        def counted(client: Any, command: str, *args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return original(client, command, *args, **kwargs)

        GatewayClient.send_command = counted  # type: ignore[method-assign]


def upstreams_of(job: dict[str, Any]) -> list[str]:
    return [job["source"]] if "source" in job else [source["table"] for source in job["sources"].values()]


def measure(work: Path, names: list[str], rounds: int) -> dict[str, Any]:
    from airflow_backfill.engine.phases.catch_up import run_catch_up
    from airflow_backfill.engine.phases.snapshot import run_snapshot
    from airflow_backfill.engine.spark_session import build_spark_session
    from airflow_backfill.job import BackfillJob
    from airflow_backfill.job_folder import load_job_folder
    from airflow_backfill.shared_forward.members import DeltaMember
    from airflow_backfill.simulator import commit_epoch, create_orders_table

    lake = work / "lake"
    declared = {job["name"]: job for job in mv_declarations(10, str(lake))}
    unknown = sorted(set(names) - set(declared))
    if unknown:
        raise SystemExit(f"--mvs: no MV named {unknown}; the names are {sorted(declared)}")
    jobs = [declared[name] for name in names]
    missing = [job["source"] for job in jobs if job.get("source", "").startswith(f"{lake}/plain_")
               and job["source"].rsplit("/", 1)[1] not in names]
    if missing:
        raise SystemExit(f"--mvs: an MV over another MV needs that MV too: add {missing}")
    write_job_folder(work / "jobs", jobs)
    upstreams = sorted({uri for job in jobs for uri in upstreams_of(job) if "/upstream_" in uri})
    for seed, uri in enumerate(upstreams):
        create_orders_table(uri, UPSTREAM_ROWS, seed=seed)
    folder = load_job_folder(str(work / "jobs"))
    if folder.errors:
        raise SystemExit(f"the job files: {folder.errors}")
    delta_jobs = {entry.name: entry.job for entry in folder.jobs if isinstance(entry.job, BackfillJob)}
    spark = build_spark_session("bench:member_rounds", 2)
    jvm = next(child for child in psutil.Process().children(recursive=True) if "java" in child.name())
    backfilled: set[str] = set()
    while len(backfilled) < len(folder.jobs):  # an MV over an MV after that MV
        for entry in folder.jobs:
            if entry.name not in backfilled and all(up.name in backfilled for up in folder.upstream_jobs(entry)):
                run_snapshot(spark, delta_jobs[entry.name])
                run_catch_up(spark, delta_jobs[entry.name])
                backfilled.add(entry.name)
    members = {name: DeltaMember(job) for name, job in delta_jobs.items()}
    calls = Py4jCalls()
    rng = random.Random(3)
    samples: dict[str, dict[str, list[float]]] = {
        name: {"seconds": [], "jvm_cpu_s": [], "python_cpu_s": [], "py4j_calls": []} for name in members}
    for _ in range(rounds):
        for uri in upstreams:
            commit_epoch(uri, rng, inserts=20, updates=20, deletes=2)
        for name, member in members.items():
            cpu, count, started = sum(jvm.cpu_times()[:2]), calls.count, time.perf_counter()
            python_cpu = time.process_time()
            member.run_round(spark)
            samples[name]["seconds"].append(time.perf_counter() - started)
            samples[name]["jvm_cpu_s"].append(sum(jvm.cpu_times()[:2]) - cpu)
            samples[name]["python_cpu_s"].append(time.process_time() - python_cpu)
            samples[name]["py4j_calls"].append(calls.count - count)
    for member in members.values():
        member.close()
    spark.stop()
    return {name: {figure: round(statistics.median(values[WARM_UP_ROUNDS:]), 3) for figure, values in figures.items()}
            for name, figures in samples.items()}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python bench/member_rounds.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8, help=f"rounds per MV (the first {WARM_UP_ROUNDS} not counted)")
    parser.add_argument("--mvs", default="plain_0,agg_1,join_0", help="MVs of the simulator's ten (bench/mv_workloads.py), comma-separated")
    parser.add_argument("--work-dir", default=None, help="scratch folder (default: a new temporary one)")
    parser.add_argument("--output", default=None, help="result file (default: bench/results/, by date and commit)")
    args = parser.parse_args(argv)
    if args.rounds <= WARM_UP_ROUNDS:
        parser.error(f"--rounds must be more than {WARM_UP_ROUNDS}: the first {WARM_UP_ROUNDS} warm the session up")
    meta = run_record.run_meta("member_rounds", "member_rounds.py", argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="member_rounds-", dir=args.work_dir) as work:
        rounds = measure(Path(work), [name.strip() for name in args.mvs.split(",") if name.strip()], args.rounds)
    result = {"meta": run_record.finish_meta(meta, time.monotonic() - started), "rounds": rounds}
    print(json.dumps(rounds, indent=1))
    print(f"wrote {run_record.write_result(result, args.output)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
