"""Start a driver JVM with the quick JIT compiler: a catch-up's when its change is small,
the shared forward's unless told otherwise.

See airflow_backfill/engine/launch/jit.py for why and the measured figures. The choice is
made in the task before spark-submit, from the upstreams' logs (no Spark), and goes into
`spark.driver.defaultJavaOptions`; the user's own JIT options in either driver option
always win.
"""

from __future__ import annotations

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from airflow_backfill.engine.launch.class_archive import DRIVER_JAVA_OPTIONS
from airflow_backfill.engine.launch.jit import (
    AUTO,
    DRIVER_DEFAULT_JAVA_OPTIONS,
    FULL,
    pending_change,
    quick_jit_suits,
    sets_own_jit,
    with_quick_jit,
)
from airflow_backfill.hooks.delta import DeltaBackfillHook
from airflow_backfill.job import BackfillJob


def choose_driver_jit(operator: SparkSubmitOperator, job: BackfillJob | None, mode: str, *,
                      long_lived: bool = False) -> None:
    """Add the quick compiler to the operator's driver options when `mode` asks for it, or
    under `auto` when the pending change of `job` is small; log the choice and what it
    rests on. `long_lived`: the shared forward, whose quick compiler gets the larger code
    cache (`launch/jit.py`)."""
    conf = dict(operator.conf or {})
    if mode == FULL:
        operator.log.info("driver JIT: optimising compiler (driver_jit='full')")
        return
    if sets_own_jit(conf.get(DRIVER_JAVA_OPTIONS), conf.get(DRIVER_DEFAULT_JAVA_OPTIONS)):
        operator.log.info("driver JIT: the driver's Java options choose it")
        return
    if mode == AUTO:
        if job is None:
            raise ValueError("driver_jit 'auto' judges one job's pending change: pass the job")
        hook = DeltaBackfillHook.for_job(job)
        try:
            change = pending_change(hook.upstreams, hook.watermarks())
        except Exception as error:  # an estimate must never fail the task: the driver reports real errors
            operator.log.warning("driver JIT: the pending change could not be estimated (%s); "
                                 "the driver keeps the optimising compiler", error)
            return
        if change is None or not quick_jit_suits(change):
            operator.log.info("driver JIT: optimising compiler (%s)",
                              "no watermark yet" if change is None else change.describe())
            return
        operator.log.info("driver JIT: the quick compiler alone, for a small catch-up (%s)", change.describe())
    else:
        operator.log.info("driver JIT: the quick compiler alone (driver_jit='quick')")
    conf[DRIVER_DEFAULT_JAVA_OPTIONS] = with_quick_jit(conf.get(DRIVER_DEFAULT_JAVA_OPTIONS), long_lived=long_lived)
    operator.conf = conf
