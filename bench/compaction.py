"""What the small files of patch rounds cost a round, and what compacting them costs.

    python bench/compaction.py [--rows 200000] [--rounds 256] [--keys 20]

An MV of `--rows` rows (one Spark-written commit, as a snapshot leaves a small MV) takes
`--rounds` forward rounds that each upsert `--keys` scattered keys as a patch
(`rounds/write.write(..., "patch", ...)`: a deletion vector on the touched files and one
small file of new rows), with no compaction. At file counts 8, 16, ... it records the
round's seconds (prepare and write, medians of the last rounds), the driver's lookup of
100 scattered keys in the MV (`keyed_rows.find_rows`), and a compaction of a copy of the
table as it stands then (`compaction.compact`). A round pays `r` seconds per small file
(the slope of the round's time over the file count); compacting every `N` rounds costs
`c / N + r * N / 2` a round, least at `N = sqrt(2 c / r)`: the figure behind
`sizes.compact_files`.
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
if str(ROOT) not in sys.path:  # `python bench/compaction.py` puts bench/, not the checkout, on the path
    sys.path.insert(0, str(ROOT))

from bench import run_record  # noqa: E402

APP = "airflow_backfill/bench"
SCHEMA = "k long, customer long, status string, amount double, quantity int"
CHECKPOINTS = (8, 16, 32, 64, 128, 256, 512)


def create_mv(spark: Any, uri: str, rows: int) -> None:
    from pyspark.sql import functions as F

    from airflow_backfill.engine.delta.commits import TABLE_PROPERTIES

    frame = spark.range(1, rows + 1).select(
        F.col("id").alias("k"), (F.col("id") % 997).alias("customer"),
        F.element_at(F.array(*(F.lit(s) for s in ("open", "shipped", "billed"))), (F.col("id") % 3 + 1).cast("int"))
        .alias("status"), (F.col("id") * 0.37).alias("amount"), (F.col("id") % 50).cast("int").alias("quantity"))
    writer = frame.coalesce(1).write.format("delta").mode("append")
    for key, value in TABLE_PROPERTIES.items():
        writer = writer.option(key, value)
    writer.option("txnAppId", APP).option("txnVersion", "0").save(uri)


def patch_round(spark: Any, uri: str, rng: random.Random, rows: int, keys: int, version: int) -> float:
    """One round of `keys` scattered upserts written as a patch; its seconds."""
    from airflow_backfill.engine.delta.commits import PRESENT
    from airflow_backfill.engine.delta.driver_rows import held_in_driver
    from airflow_backfill.engine.planning.round_plan import PATCH
    from airflow_backfill.engine.rounds.write import prepare, write

    changed = [(k, k % 997, "changed", float(version), version % 50, True) for k in rng.sample(range(1, rows + 1), keys)]
    frame = held_in_driver(spark.createDataFrame(changed, f"{SCHEMA}, {PRESENT} boolean"))
    assert frame is not None, "the round's few rows are the driver's to hold"
    started = time.perf_counter()
    prepared = prepare(spark, uri, frame, ("k",), null_safe=False)
    try:
        write(spark, prepared, PATCH, app_id=APP, version=version, user_metadata="{}")
    finally:
        prepared.release()
    return time.perf_counter() - started


def lookup_seconds(uri: str, rows: int, rng: random.Random) -> float:
    import pyarrow as pa

    from airflow_backfill.engine.delta.keyed_rows import find_rows
    from airflow_backfill.engine.delta.log_state import table_state

    state = table_state(uri)
    assert state is not None, f"no Delta table at {uri}"
    keys = pa.table({"k": pa.array(rng.sample(range(1, rows + 1), 100), pa.int64())})
    started = time.perf_counter()
    found = find_rows(state, ["k"], keys, ["k", "customer", "status", "amount", "quantity"])
    assert found is not None and found.rows.num_rows == 100
    return time.perf_counter() - started


def compaction_seconds(spark: Any, uri: str, scratch: str) -> dict[str, Any]:
    """A compaction of a copy of the table (the table itself keeps growing)."""
    from airflow_backfill.engine.delta.compaction import compact
    from airflow_backfill.engine.sizes import overridden

    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(uri, scratch)
    with overridden(compact_files=1):
        started = time.perf_counter()
        done = compact(spark, scratch, ["k"])
        seconds = time.perf_counter() - started
    assert done is not None
    shutil.rmtree(scratch, ignore_errors=True)
    return {"seconds": round(seconds, 3), "files_removed": done.removed, "bytes_read": done.bytes_read}


def measure(work: Path, rows: int, rounds: int, keys: int) -> dict[str, Any]:
    from airflow_backfill.engine.delta.log_state import table_state
    from airflow_backfill.engine.spark_session import build_spark_session

    spark = build_spark_session("bench:compaction", 2)
    uri = str(work / "mv")
    create_mv(spark, uri, rows)
    rng = random.Random(17)
    for version in range(1, 4):  # warm-up: the first patches load classes
        patch_round(spark, uri, rng, rows, keys, version)
    compaction_seconds(spark, uri, str(work / "copy"))
    round_times: list[tuple[int, float]] = []
    points = []
    for version in range(4, rounds + 4):
        seconds = patch_round(spark, uri, rng, rows, keys, version)
        state = table_state(uri)
        assert state is not None
        round_times.append((len(state.files), seconds))
        if len(state.files) in CHECKPOINTS:
            recent = [s for _, s in round_times[-5:]]
            points.append({
                "files": len(state.files),
                "round_median_s": round(statistics.median(recent), 4),
                "lookup_s": round(statistics.median(lookup_seconds(uri, rows, rng) for _ in range(5)), 4),
                "compaction": compaction_seconds(spark, uri, str(work / "copy")),
            })
    spark.stop()
    files = [count for count, _ in round_times]
    times = [seconds for _, seconds in round_times]
    slope = statistics.linear_regression(files, times).slope
    return {"rows": rows, "keys_per_round": keys, "rounds": rounds, "points": points,
            "round_seconds_per_file": round(slope, 6)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python bench/compaction.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000, help="MV rows")
    parser.add_argument("--rounds", type=int, default=256, help="patch rounds without compaction")
    parser.add_argument("--keys", type=int, default=20, help="scattered keys each round upserts")
    parser.add_argument("--work-dir", default=None, help="scratch folder (default: a new temporary one)")
    parser.add_argument("--output", default=None, help="result file (default: bench/results/, by date and commit)")
    args = parser.parse_args(argv)
    meta = run_record.run_meta("compaction", "compaction.py", argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="compaction-", dir=args.work_dir) as work:
        measured = measure(Path(work), args.rows, args.rounds, args.keys)
    result = {"meta": run_record.finish_meta(meta, time.monotonic() - started), "compaction": measured}
    print(json.dumps(measured, indent=1))
    print(f"wrote {run_record.write_result(result, args.output)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
