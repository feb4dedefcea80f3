"""Map a phase's parallelism (one number in the job) to Spark settings.

A parallelism `N` means "N tasks run at once, and shuffles produce N partitions":

- embedded/local master (`local`, `local[K]`, `local[*]`): `local[N]`, `N` shuffle
  partitions and default parallelism `N`;
- cluster master (`spark://`, `yarn`, `k8s://`, `local-cluster[...]`): the smallest set
  of executors with at most `executor_cores` cores each whose slots cover `N`
  (`executors = ceil(N / executor_cores)`, `cores = ceil(N / executors)`), `N` shuffle
  partitions and default parallelism `N`; with dynamic allocation the executor count
  becomes the upper bound instead of a fixed number.

Pure and free of Spark imports, so `build_spark_session` (inside the phase) and the
Airflow operators (before `spark-submit`) derive the same settings. See
docs/live-control.md.
"""

from __future__ import annotations

import math
from typing import Any

from airflow_backfill.exceptions import BackfillConfigError
from airflow_backfill.job import validate_parallelism

DEFAULT_EXECUTOR_CORES = 4
"""Cores per executor when the cluster does not set `spark.executor.cores`: small enough
to pack executors on common nodes, large enough to share broadcast data in a JVM."""

MAX_EXECUTOR_CORES = 256
"""Upper bound for `spark.executor.cores`; a larger value is almost surely a typo."""

CLUSTER_MASTER_PREFIXES = ("spark://", "yarn", "k8s://", "local-cluster[")
"""Masters whose tasks run in separate executors, sized by executors x cores."""

SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
DEFAULT_PARALLELISM = "spark.default.parallelism"


def is_local_master(master: str) -> bool:
    """True for the embedded masters (`local`, `local[N]`, `local[*]`, `local[N,F]`)."""
    return master == "local" or master.startswith("local[")


def check_master(master: Any) -> str:
    """The master, or a clear error when it is not a Spark master this project maps."""
    if isinstance(master, str) and (is_local_master(master) or master.startswith(CLUSTER_MASTER_PREFIXES)):
        return master
    raise BackfillConfigError(
        f"unsupported Spark master {master!r}: use local[N] (embedded), spark://HOST:PORT, yarn "
        "or k8s://URL (set it in the Spark connection or spark-submit --master)."
    )


def runtime_conf_for(parallelism: int) -> dict[str, str]:
    """What a running session can change between rounds: shuffle partitions only.

    `local[N]`, executors and `spark.default.parallelism` are fixed when the JVM starts,
    so a live `alter` changes shuffle partitions (and the snapshot's output width).
    """
    validate_parallelism("parallelism", parallelism)
    return {SHUFFLE_PARTITIONS: str(parallelism)}


def task_conf_for(parallelism: int) -> dict[str, str]:
    """Master-independent settings at session start: shuffle partitions and default parallelism."""
    return {**runtime_conf_for(parallelism), DEFAULT_PARALLELISM: str(parallelism)}


def executor_shape(parallelism: int, executor_cores: int = DEFAULT_EXECUTOR_CORES) -> tuple[int, int]:
    """(executors, cores per executor): the fewest executors of <= executor_cores covering N."""
    validate_parallelism("parallelism", parallelism)
    if isinstance(executor_cores, bool) or not isinstance(executor_cores, int):
        raise BackfillConfigError(
            f"spark.executor.cores must be a whole number, got {executor_cores!r}; fix the Spark settings."
        )
    if not 1 <= executor_cores <= MAX_EXECUTOR_CORES:
        raise BackfillConfigError(
            f"spark.executor.cores must be between 1 and {MAX_EXECUTOR_CORES}, got {executor_cores}; "
            "fix the Spark settings."
        )
    executors = math.ceil(parallelism / executor_cores)
    return executors, math.ceil(parallelism / executors)


def spark_conf_for(
    parallelism: int,
    master: str,
    *,
    executor_cores: int | None = None,
    dynamic_allocation: bool = False,
) -> dict[str, str]:
    """Spark settings that give a phase `parallelism` concurrent tasks on `master`.

    Local masters get `spark.master=local[N]`; cluster masters keep their master and get
    executors x cores (or dynamic-allocation bounds). Parallelism must be in
    1..MAX_PARALLELISM (validate_parallelism); errors name the value and the fix.
    """
    validate_parallelism("parallelism", parallelism)
    master = check_master(master)
    settings = task_conf_for(parallelism)
    if is_local_master(master):
        return {"spark.master": f"local[{parallelism}]", **settings}
    executors, cores = executor_shape(
        parallelism, DEFAULT_EXECUTOR_CORES if executor_cores is None else executor_cores
    )
    sizing = {"spark.executor.cores": str(cores), "spark.cores.max": str(executors * cores)}
    if dynamic_allocation:
        sizing |= {
            "spark.dynamicAllocation.minExecutors": "1",
            "spark.dynamicAllocation.initialExecutors": str(executors),
            "spark.dynamicAllocation.maxExecutors": str(executors),
        }
    else:
        sizing["spark.executor.instances"] = str(executors)
    return {**sizing, **settings}

