"""What the snapshot's file layout costs and saves, side by side in one session.

    python bench/snapshot_layout.py [--rows 2000000] [--repeats 3] [--lookups 5] [--sweep]

An upstream of `--rows` orders (keys 1..rows, written by delta-rs in eight commits in key
order) and a stateless MV over it. For each layout (rows per file, rows per Parquet row
group; `0, 0` is Spark's own layout without the key sort), alternating with the others:
the snapshot's seconds (medians of `--repeats`), and a plain Spark job of the same query
(Parquet in, Parquet out) as the baseline of the snapshot's target; then, on the last MV
of each layout, the driver's lookup of 500 scattered keys and of 500 keys that lie
together (`keyed_rows.find_rows`, every column, as a round's patch asks it; medians over
`--lookups` key sets): seconds, the process's CPU seconds, files touched and key values
read; and a Spark scan of the whole MV (what a reader of it pays). The snapshot's figures
include the driver JVM's CPU seconds (local mode: the executors' too), which a loaded
machine changes less than wall time. `--sweep` adds the neighbouring
bounds that chose the defaults.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python bench/snapshot_layout.py` puts bench/, not the checkout, on the path
    sys.path.insert(0, str(ROOT))

from bench import run_record  # noqa: E402

QUERY = ("SELECT order_id, customer_id, status, amount * 2 AS doubled, quantity, created FROM source "
         "WHERE quantity >= 0")
KEYS = 500
TODAY = (0, 0)


def layouts(sweep: bool, named: str | None = None) -> list[tuple[int, int]]:
    """(rows per file, rows per row group): Spark's own, the defaults, and with `sweep` the
    bounds around them; `named` ("0x0,1000000x262144"): those and the defaults."""
    from airflow_backfill.engine.sizes import Sizes

    chosen = (Sizes().mv_file_rows, Sizes().mv_row_group_rows)
    found = [TODAY, chosen]
    if named:
        found += [(int(files), int(groups)) for files, groups in (item.split("x") for item in named.split(","))]
    if sweep:
        for group_rows in (1 << 20, 1 << 18, 1 << 16, 1 << 12):
            found.append((chosen[0], group_rows))
        for file_rows in (250_000, 4_000_000):
            found.append((file_rows, chosen[1]))
    return list(dict.fromkeys(found))


def write_upstream(uri: str, rows: int, commits: int = 8) -> None:
    """Orders 1..rows in `commits` appends, each a file of the next key range."""
    import numpy as np
    import pyarrow as pa
    from deltalake import write_deltalake

    rng = np.random.default_rng(7)
    statuses = np.array(["open", "shipped", "billed", "returned"])
    step = -(-rows // commits)
    for start in range(0, rows, step):
        keys = np.arange(start + 1, min(rows, start + step) + 1, dtype=np.int64)
        batch = pa.table({
            "order_id": keys,
            "customer_id": rng.integers(1, rows // 10 + 2, len(keys)),
            "status": pa.array(statuses[rng.integers(0, 4, len(keys))]),
            "amount": rng.random(len(keys)) * 1000,
            "quantity": rng.integers(1, 50, len(keys)).astype(np.int32),
            "created": pa.array(keys * 1_000_000 + 1_700_000_000_000_000, pa.timestamp("us", tz="UTC")),
        })
        write_deltalake(uri, batch, mode="append", configuration={"delta.enableChangeDataFeed": "true"})


class JvmClock:
    """Wall seconds and the driver JVM's CPU seconds (local mode: the executors' too) of a
    block: CPU time is what a layout adds to the work, whatever else loads the machine."""

    def __init__(self) -> None:
        import psutil

        self.jvm = next(child for child in psutil.Process().children(recursive=True) if "java" in child.name())

    def cpu(self) -> float:
        return float(sum(self.jvm.cpu_times()[:2]))


def snapshot_seconds(spark: Any, upstream: str, target: str, layout: tuple[int, int],
                     clock: JvmClock) -> tuple[float, float]:
    from airflow_backfill.engine.phases.snapshot import run_snapshot
    from airflow_backfill.engine.sizes import overridden
    from airflow_backfill.job import BackfillJob

    shutil.rmtree(target, ignore_errors=True)
    job = BackfillJob(name="layout", source=upstream, target=target, query=QUERY, primary_key=("order_id",),
                      backfill_parallelism=2)
    with overridden(mv_file_rows=layout[0], mv_row_group_rows=layout[1]):
        started, cpu = time.perf_counter(), clock.cpu()
        run_snapshot(spark, job, parallelism=2)
        return time.perf_counter() - started, clock.cpu() - cpu


def plain_seconds(spark: Any, upstream: str, out_dir: str, clock: JvmClock) -> tuple[float, float]:
    from deltalake import DeltaTable

    from bench.workload import plain_spark_job

    shutil.rmtree(out_dir, ignore_errors=True)
    files = DeltaTable(upstream).file_uris()
    started, cpu = time.perf_counter(), clock.cpu()
    plain_spark_job(spark, files, QUERY, out_dir)
    return time.perf_counter() - started, clock.cpu() - cpu


def file_facts(uri: str) -> dict[str, Any]:
    """Files, row groups, rows per file, and whether each file's keys are sorted."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from airflow_backfill.engine.delta.log_state import table_state

    state = table_state(uri)
    assert state is not None
    groups, rows, in_order = [], [], 0
    for live in state.files:
        parquet = pq.ParquetFile(live.uri)
        groups.append(parquet.num_row_groups)
        rows.append(parquet.metadata.num_rows)
        keys = parquet.read(columns=["order_id"]).column(0)
        in_order += bool(len(keys) < 2 or pc.all(pc.greater(keys[1:], keys[:-1])).as_py())
    return {"files": len(rows), "row_groups": sum(groups), "rows_per_file_max": max(rows),
            "sorted_files": in_order}


def lookups(uri: str, rows: int, sets: int, clustered: bool) -> dict[str, Any]:
    """Medians over `sets` key sets of one driver lookup of `KEYS` keys (every column)."""
    import pyarrow as pa

    from airflow_backfill.engine.delta.keyed_rows import find_rows
    from airflow_backfill.engine.delta.log_state import table_state

    rng = random.Random(11 if clustered else 13)
    state = table_state(uri)
    assert state is not None
    columns = ["order_id", "customer_id", "status", "doubled", "quantity", "created"]
    seconds, cpu, touched, scanned = [], [], [], []
    for _ in range(sets):
        if clustered:
            first = rng.randrange(1, rows - KEYS)
            keys = list(range(first, first + KEYS))
        else:
            keys = rng.sample(range(1, rows + 1), KEYS)
        started, used = time.perf_counter(), time.process_time()
        found = find_rows(state, ["order_id"], pa.table({"order_id": pa.array(keys, pa.int64())}), columns)
        seconds.append(time.perf_counter() - started)
        cpu.append(time.process_time() - used)
        assert found is not None and found.rows.num_rows == KEYS
        touched.append(len(found.files))
        scanned.append(found.scanned)
    return {"seconds": round(statistics.median(seconds), 4), "cpu_s": round(statistics.median(cpu), 4),
            "files_touched": statistics.median(touched),
            "key_values_read": statistics.median(scanned)}


def scan_seconds(spark: Any, uri: str, repeats: int) -> float:
    """A Spark read of every row and column of the MV (median)."""
    from pyspark.sql import functions as F

    frame = spark.read.format("delta").load(uri)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        frame.agg(F.sum("doubled"), F.max("status"), F.sum("quantity"), F.max("created"),
                  F.sum("customer_id")).collect()
        times.append(time.perf_counter() - started)
    return round(statistics.median(times), 3)


def measure(work: Path, rows: int, repeats: int, sets: int, chosen: list[tuple[int, int]]) -> dict[str, Any]:
    from airflow_backfill.engine.spark_session import build_spark_session

    spark = build_spark_session("bench:snapshot_layout", 2)
    clock = JvmClock()
    upstream = str(work / "orders")
    write_upstream(upstream, rows)
    targets = {layout: str(work / f"mv_{layout[0]}_{layout[1]}") for layout in chosen}
    for layout in chosen:  # warm-up: class loading and code generation, not measured
        snapshot_seconds(spark, upstream, targets[layout], layout, clock)
    plain_seconds(spark, upstream, str(work / "plain"), clock)
    times: dict[tuple[int, int], list[tuple[float, float]]] = {layout: [] for layout in chosen}
    plain: list[tuple[float, float]] = []
    for round_number in range(repeats):
        order = chosen if round_number % 2 == 0 else list(reversed(chosen))
        plain.append(plain_seconds(spark, upstream, str(work / "plain"), clock))
        for layout in order:
            times[layout].append(snapshot_seconds(spark, upstream, targets[layout], layout, clock))
    results = []
    for layout in chosen:
        uri = targets[layout]
        results.append({
            "file_rows": layout[0], "row_group_rows": layout[1],
            **_medians("snapshot", times[layout]),
            **file_facts(uri),
            "lookup_scattered": lookups(uri, rows, sets, clustered=False),
            "lookup_clustered": lookups(uri, rows, sets, clustered=True),
            "spark_scan_s": scan_seconds(spark, uri, repeats),
        })
    spark.stop()
    baseline = _medians("plain", plain)
    for result in results:
        result["ratio_to_plain"] = round(result["snapshot_median_s"] / baseline["plain_median_s"], 3)
        result["cpu_ratio_to_plain"] = round(result["snapshot_cpu_median_s"] / baseline["plain_cpu_median_s"], 3)
    return {"rows": rows, **baseline, "layouts": results}


def _medians(name: str, runs: list[tuple[float, float]]) -> dict[str, Any]:
    """Each run's wall and JVM CPU seconds, and their medians."""
    return {f"{name}_s": [round(wall, 3) for wall, _ in runs],
            f"{name}_median_s": round(statistics.median(wall for wall, _ in runs), 3),
            f"{name}_cpu_s": [round(cpu, 3) for _, cpu in runs],
            f"{name}_cpu_median_s": round(statistics.median(cpu for _, cpu in runs), 3),
            f"{name}_cpu_min_s": round(min(cpu for _, cpu in runs), 3)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python bench/snapshot_layout.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000, help="upstream (and MV) rows")
    parser.add_argument("--repeats", type=int, default=3, help="snapshots per layout (medians)")
    parser.add_argument("--lookups", type=int, default=5, help="key sets per kind of lookup (medians)")
    parser.add_argument("--sweep", action="store_true", help="also the bounds around the defaults")
    parser.add_argument("--layouts", default=None, help='also these layouts, "FILE_ROWSxGROUP_ROWS,..."')
    parser.add_argument("--work-dir", default=None, help="scratch folder (default: a new temporary one)")
    parser.add_argument("--output", default=None, help="result file (default: bench/results/, by date and commit)")
    args = parser.parse_args(argv)
    meta = run_record.run_meta("snapshot_layout", "snapshot_layout.py", argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="snapshot_layout-", dir=args.work_dir) as work:
        measured = measure(Path(work), args.rows, args.repeats, args.lookups, layouts(args.sweep, args.layouts))
    result = {"meta": run_record.finish_meta(meta, time.monotonic() - started), "snapshot_layout": measured}
    print(json.dumps(measured, indent=1))
    print(f"wrote {run_record.write_result(result, args.output)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
