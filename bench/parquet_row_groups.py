"""What small Parquet row groups cost Spark's writer, with and without a dictionary bound.

    python bench/parquet_row_groups.py [--rows 2000000] [--repeats 4]

One cached DataFrame of `--rows` rows in six columns like an MV's (a unique id, a
customer id of 200,001 values, a status of four, a random double, a small int, a
timestamp), written as Parquet in two tasks under each setting in turn: Parquet's own
row groups (128 MiB), row groups of 262,144 and 16,384 rows with Parquet's 1 MiB
dictionary bound, and the same with the bound `delta/file_layout.py` sets (2 bytes a
row). Per setting: the medians of the wall and driver JVM CPU seconds (the first round
not counted) and the bytes written.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python bench/parquet_row_groups.py` puts bench/, not the checkout, on the path
    sys.path.insert(0, str(ROOT))

from bench import run_record  # noqa: E402

GROUP_ROWS = "parquet.block.row.count.limit"
DICTIONARY = "parquet.dictionary.page.size"
SETTINGS: dict[str, dict[str, str]] = {
    "parquet's own": {},
    "262144 rows": {GROUP_ROWS: "262144"},
    "262144 rows, 512 KiB dictionary": {GROUP_ROWS: "262144", DICTIONARY: str(262144 * 2)},
    "16384 rows": {GROUP_ROWS: "16384"},
    "16384 rows, 32 KiB dictionary": {GROUP_ROWS: "16384", DICTIONARY: str(16384 * 2)},
}


def measure(work: Path, rows: int, repeats: int) -> dict[str, Any]:
    import psutil
    from pyspark.sql import functions as F

    from airflow_backfill.engine.spark_session import build_spark_session

    spark = build_spark_session("bench:parquet_row_groups", 2)
    jvm = next(child for child in psutil.Process().children(recursive=True) if "java" in child.name())
    statuses = F.array(*(F.lit(status) for status in ("open", "shipped", "billed", "returned")))
    frame = spark.range(1, rows + 1).select(
        F.col("id").alias("order_id"), (F.col("id") * 7 % 200001).alias("customer_id"),
        F.element_at(statuses, (F.col("id") % 4 + 1).cast("int")).alias("status"), (F.rand(3) * 1000).alias("amount"),
        (F.col("id") % 50).cast("int").alias("quantity"),
        F.timestamp_micros(F.col("id") * 1_000_000 + 1_700_000_000_000_000).alias("created"),
    ).repartition(2).cache()
    frame.count()
    out = str(work / "out")
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in SETTINGS}
    sizes: dict[str, int] = {}
    for _ in range(repeats + 1):
        for name, settings in SETTINGS.items():
            for key, value in settings.items():
                spark.conf.set(key, value)
            shutil.rmtree(out, ignore_errors=True)
            cpu, started = sum(jvm.cpu_times()[:2]), time.perf_counter()
            frame.write.parquet(out)
            runs[name].append((time.perf_counter() - started, sum(jvm.cpu_times()[:2]) - cpu))
            sizes[name] = sum(os.path.getsize(path) for path in glob.glob(f"{out}/*.parquet"))
            for key in settings:
                spark.conf.unset(key)
    spark.stop()
    return {name: {"wall_median_s": round(statistics.median(w for w, _ in done[1:]), 3),
                   "cpu_median_s": round(statistics.median(c for _, c in done[1:]), 3), "bytes": sizes[name]}
            for name, done in runs.items()}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python bench/parquet_row_groups.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000, help="rows written")
    parser.add_argument("--repeats", type=int, default=4, help="measured writes per setting (medians)")
    parser.add_argument("--output", default=None, help="result file (default: bench/results/, by date and commit)")
    args = parser.parse_args(argv)
    meta = run_record.run_meta("parquet_row_groups", "parquet_row_groups.py", argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="parquet_row_groups-") as work:
        measured = measure(Path(work), args.rows, args.repeats)
    result = {"meta": run_record.finish_meta(meta, time.monotonic() - started), "parquet_row_groups": measured}
    print(json.dumps(measured, indent=1))
    print(f"wrote {run_record.write_result(result, args.output)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
