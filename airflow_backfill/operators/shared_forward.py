"""The shared forward as one Airflow task: one `spark-submit` keeps every MV of a job folder
fresh (`spark_jobs/shared_forward.py`), in one worker slot, one Spark driver JVM and one
Python driver, however many MVs the folder holds."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from airflow_backfill.engine.delta.jars import delta_spark_conf
from airflow_backfill.engine.launch.jit import QUICK, check_shared_forward_mode
from airflow_backfill.engine.parallelism import spark_conf_for
from airflow_backfill.hooks.spark_connection import spark_master
from airflow_backfill.job import validate_parallelism, validate_seconds, validate_whole_number
from airflow_backfill.operators.driver_jit_launch import choose_driver_jit
from airflow_backfill.operators.driver_settings import hand_settings_to_driver
from airflow_backfill.operators.jvm_archive_launch import start_driver_on_archive
from airflow_backfill.operators.phases import DEFAULT_STOP_TIMEOUT, entry_point
from airflow_backfill.shared_forward import DEFAULT_BACKFILL_WORKERS, DEFAULT_WORKERS


class SharedForwardOperator(SparkSubmitOperator):
    """Keep the MVs of `folder` fresh until the task is stopped.

    :param folder: the folder of job files (absolute; `backfill_dags` resolves it).
    :param parallelism: Spark parallelism of the application (its `local[N]`, or its
        executors' cores on a cluster), shared by every MV's rounds.
    :param workers: rounds applied at once (threads sharing the SparkSession; default 4,
        the freshest for fifty MVs on 2 cores: docs/platform.md).
    :param poll_interval: seconds between two checks of an idle MV's upstream.
    :param status_file: where the application writes its members' status every second
        (templated; default: none).
    :param max_seconds: stop after this many seconds (templated; tests and benchmarks).
    :param stop_timeout: seconds the rounds in flight get to commit once the task is stopped.
    :param backfill: also build the folder's MVs that are not created yet (a folder
        backfilled as one: snapshot and catch-up in this application, an MV over an MV
        after its source), then keep them fresh with the others.
    :param backfill_workers: MVs built at once with `backfill` (default 2).
    :param driver_jit: `quick` (default) starts the driver JVM with the quick JIT compiler
        alone: the rounds are small and varied, and the optimising compiler's work costs more
        CPU than its code saves (airflow_backfill/engine/launch/jit.py); `full` keeps both.
        JIT options in the user's driver options always win.
    """

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "status_file", "max_seconds")

    def __init__(
        self,
        *,
        folder: str,
        parallelism: int = 2,
        workers: int = DEFAULT_WORKERS,
        poll_interval: float = 0.5,
        status_file: str | None = None,
        max_seconds: float | str | None = None,
        stop_timeout: float = DEFAULT_STOP_TIMEOUT,
        driver_jit: str = QUICK,
        conn_id: str = "spark_default",
        backfill: bool = False,
        backfill_workers: int = DEFAULT_BACKFILL_WORKERS,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("name", "airflow_backfill-shared_forward")
        kwargs.setdefault("env_vars", {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable})
        super().__init__(application=entry_point("shared_forward"), conn_id=conn_id, **kwargs)
        self.folder = folder
        self.parallelism = validate_parallelism("parallelism", parallelism)
        validate_whole_number("workers", workers, 64)
        validate_whole_number("backfill_workers", backfill_workers, 64)
        self.backfill = bool(backfill)
        self.backfill_workers = backfill_workers
        validate_seconds("poll_interval", poll_interval)
        validate_seconds("stop_timeout", stop_timeout)
        self.workers = workers
        self.poll_interval = poll_interval
        self.status_file = status_file
        self.max_seconds = max_seconds
        self.stop_timeout = stop_timeout
        self.driver_jit = check_shared_forward_mode(driver_jit)
        self.spark_conn_id = conn_id

    def execute(self, context: Any) -> None:
        self.application_args = [
            "--folder", self.folder, "--parallelism", str(self.parallelism), "--workers", str(self.workers),
            "--poll-interval", str(self.poll_interval), "--stop-grace", str(self.stop_timeout),
        ]
        if self.backfill:
            self.application_args += ["--backfill", "--backfill-workers", str(self.backfill_workers)]
        if self.status_file:
            self.application_args += ["--status-file", str(self.status_file)]
        if self.max_seconds not in (None, "", "None"):
            self.application_args += ["--max-seconds", str(float(str(self.max_seconds)))]
        sizing = spark_conf_for(self.parallelism, spark_master(self.spark_conn_id))
        sizing.pop("spark.master", None)
        self.conf = {**delta_spark_conf(), **sizing, **(self.conf or {})}
        hand_settings_to_driver(self)
        start_driver_on_archive(self, self.spark_conn_id)
        choose_driver_jit(self, None, self.driver_jit, long_lived=True)
        self.log.info("shared forward of %s at parallelism %s with %s workers",
                      self.folder, self.parallelism, self.workers)
        super().execute(context)

    def on_kill(self) -> None:
        """Ask the driver to let its rounds commit, then let the provider end spark-submit."""
        from airflow_backfill.process import stop_drivers

        if not stop_drivers(os.getpid(), "shared_forward.py", self.stop_timeout):
            self.log.warning("the shared forward did not stop within %.1f s; its rounds in flight are "
                             "abandoned (each MV stays at its last committed watermark)", self.stop_timeout)
        super().on_kill()
