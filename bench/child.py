"""One benchmark configuration in its own process: `python -m bench.child CONFIG RESULT`.

A process per parallelism is the only honest way to compare parallelisms locally: the
`local[N]` master is fixed when the JVM starts. The child builds its session exactly as
a phase does (`build_spark_session`), runs the sections it was given in order, samples
the memory of its process tree (the JVM included) per section and writes one JSON file.
"""

from __future__ import annotations

import json
import logging
import sys
import traceback
from typing import Any

from bench.measure import MemorySampler, stopwatch
from bench.sections import SECTIONS, SectionSettings
from bench.workload import Workspace


def settings_from(config: dict[str, Any], memory: MemorySampler) -> SectionSettings:
    return SectionSettings(
        workspace=Workspace(config["work_dir"]),
        parallelism=int(config["parallelism"]),
        repeats=int(config["repeats"]),
        seed=int(config["seed"]),
        freshness_epochs=int(config["freshness_epochs"]),
        epoch_interval=float(config["epoch_interval"]),
        poll_interval=float(config["poll_interval"]),
        memory=memory,
        quick=bool(config.get("quick", False)),
    )


def run(config: dict[str, Any]) -> dict[str, Any]:
    """Run the configured sections; a failing section is reported, the others still run."""
    from airflow_backfill.engine.spark_session import build_spark_session

    results: dict[str, Any] = {}
    with MemorySampler() as memory:
        settings = settings_from(config, memory)
        with stopwatch() as start_up:
            spark = build_spark_session(f"bench-p{settings.parallelism}", settings.parallelism)
            spark.range(1).count()  # the first job pays for class loading: not a section's cost
        results["_session"] = {"start_s": round(start_up(), 3), "master": spark.sparkContext.master}
        for name in config["sections"]:
            memory.reset()
            with stopwatch() as elapsed:
                try:
                    results[name] = SECTIONS[name](spark, settings)
                except Exception as error:
                    logging.getLogger("bench").exception("section %s failed", name)
                    results[name] = {"status": "failed", "error": f"{type(error).__name__}: {error}",
                                     "traceback": traceback.format_exc(limit=5)}
            results[name]["section_s"] = round(elapsed(), 3)
            results[name]["memory"] = memory.peaks_mib()
        spark.stop()
    return results


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m bench.child CONFIG.json RESULT.json", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    with open(args[0]) as handle:
        config = json.load(handle)
    results = run(config)
    with open(args[1], "w") as handle:
        json.dump(results, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
