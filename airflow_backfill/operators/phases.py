"""The three phases as `spark-submit` tasks.

Each operator is a SparkSubmitOperator whose application is the phase's entry point in
`spark_jobs/`, resolved from the installed package, and whose job travels as a file
(`--job FILE`, see job_file.py), so the command in the task's log can be copied to rerun
the phase by hand. After `spark-submit` returns, the operator
reads the MV's committed watermark from the Delta log, never from Spark's output, and
pushes it to XCom.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Asset, XComArg

from airflow_backfill.engine.delta.jars import delta_spark_conf
from airflow_backfill.engine.launch.jit import AUTO, check_mode
from airflow_backfill.engine.parallelism import spark_conf_for
from airflow_backfill.hooks.delta import DeltaBackfillHook, job_source
from airflow_backfill.hooks.spark_connection import spark_master
from airflow_backfill.job import BackfillJob, validate_optional_cap
from airflow_backfill.job_input import as_job
from airflow_backfill.links.progress import BackfillProgressLink
from airflow_backfill.operators.driver_jit_launch import choose_driver_jit
from airflow_backfill.operators.driver_settings import hand_settings_to_driver
from airflow_backfill.operators.job_file import write_job_file
from airflow_backfill.operators.jvm_archive_launch import start_driver_on_archive
from airflow_backfill.overrides import group_overrides, job_overrides
from airflow_backfill.serialized_job import SerializesJob


def entry_point(phase: str) -> str:
    """Path of the phase's entry point, `airflow_backfill.spark_jobs.<phase>` (what spark-submit runs)."""
    spec = importlib.util.find_spec(f"airflow_backfill.spark_jobs.{phase}")
    if spec is None or spec.origin is None:
        raise RuntimeError(f"airflow_backfill.spark_jobs.{phase} is not installed; reinstall airflow-backfill.")
    return spec.origin


def _versions(value: Any) -> dict[str, int]:
    """A mapping of upstream versions, as given or as its rendered JSON."""
    if isinstance(value, str):
        value = json.loads(value)
    if not isinstance(value, Mapping):
        raise ValueError(f"epochs must map each upstream's name to a version, got {value!r}")
    return {str(name): int(version) for name, version in value.items()}


def _optional(value: Any, convert: Any) -> Any:
    """Rendered templates arrive as strings; '' and 'None' mean unset."""
    if value in (None, "", "None"):
        return None
    return convert(value)


class _PhaseOperator(SerializesJob, SparkSubmitOperator):
    """Common part: job, parallelism, dag_run.conf overrides and the watermark XCom.

    :param conf_key: the `dag_run.conf` key of this job's own overrides (default: the
        job's name; the task group factory passes its group id).
    """

    phase: str = ""
    xcom_key: str = ""
    uses_backfill_parallelism: bool = True
    operator_extra_links = (BackfillProgressLink(),)

    def __init__(
        self,
        *,
        job: BackfillJob | Mapping[str, Any] | str,
        parallelism: int | None = None,
        conn_id: str = "spark_default",
        conf_key: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.job = as_job(job)
        self.conf_key = conf_key or self.job.name
        kwargs.setdefault("name", f"airflow_backfill-{self.job.name}-{self.phase}")
        kwargs.setdefault("env_vars", {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable})
        super().__init__(application=entry_point(self.phase), conn_id=conn_id, **kwargs)
        self.spark_conn_id = conn_id
        self.parallelism = parallelism

    def effective_job(self, context: Any) -> tuple[BackfillJob, dict[str, Any]]:
        """The job with this run's validated `dag_run.conf` overrides applied (see overrides.py)."""
        dag_run = context.get("dag_run")
        overrides = group_overrides(getattr(dag_run, "conf", None) or {}, self.conf_key)
        return self.job.with_overrides(**job_overrides(overrides)), overrides

    def phase_parallelism(self, job: BackfillJob) -> int:
        if self.parallelism is not None:
            return self.parallelism
        return job.backfill_parallelism if self.uses_backfill_parallelism else job.parallelism

    def phase_arguments(self, context: Any, overrides: Mapping[str, Any]) -> list[str]:
        """Arguments of this phase's entry point besides the job and the parallelism."""
        return []

    def sizing(self, parallelism: int) -> dict[str, str]:
        """Spark settings for `parallelism` on the connection's master, fixed at submit time.

        On a cluster these size the executors (they cannot change once the application
        runs); locally the phase itself starts `local[N]`, so `spark.master` is left to
        the connection.
        """
        master = spark_master(self.spark_conn_id)
        conf = self.conf or {}
        executor_cores = conf.get("spark.executor.cores")
        settings = spark_conf_for(
            parallelism, master,
            executor_cores=int(executor_cores) if executor_cores is not None else None,
            dynamic_allocation=str(conf.get("spark.dynamicAllocation.enabled", "false")).lower() == "true",
        )
        settings.pop("spark.master", None)
        return settings

    def execute(self, context: Any) -> None:
        self.publish_progress_link(context)
        job, overrides = self.effective_job(context)
        parallelism = self.phase_parallelism(job)
        self.application_args = [
            "--job", write_job_file(job.name, job.to_json()), "--parallelism", str(parallelism),
            *self.phase_arguments(context, overrides),
        ]
        sizing = self.sizing(parallelism)
        # The user's conf wins (a cluster with its own Delta jars sets spark.jars), except
        # the cores per executor: theirs is the upper bound the sizing already honoured.
        self.conf = {**delta_spark_conf(), **sizing, **self.object_store_conf(job), **(self.conf or {})}
        if "spark.executor.cores" in sizing:
            self.conf["spark.executor.cores"] = sizing["spark.executor.cores"]
        hand_settings_to_driver(self)
        start_driver_on_archive(self, self.spark_conn_id)
        self.choose_jit(job)
        self.log.info("%s of job %s at parallelism %s: %s -> %s",
                      self.phase, job.name, parallelism, job_source(job), job.target)
        super().execute(context)
        watermark = DeltaBackfillHook.for_job(job).watermark()
        self.committed_watermark = watermark
        self.log.info("%s done: the MV's committed watermark is %s", self.phase, watermark)
        if self.xcom_key:
            context["ti"].xcom_push(key=self.xcom_key, value=watermark)
        self.annotate_asset_events(context, job, watermark)
        self.after_commit(context, watermark)

    def choose_jit(self, job: BackfillJob) -> None:
        """Driver JIT options of this phase; the optimising compiler unless a phase says otherwise."""

    def object_store_conf(self, job: BackfillJob) -> dict[str, str]:
        """S3A settings for a job with an `aws_conn_id`; its credentials go to spark-submit's
        environment, never to its command line.

        YARN and Kubernetes drivers only receive environment variables through `--conf`
        (visible in process lists), so there the cluster's own S3A credentials (instance
        role, IRSA...) apply and only the endpoint and region are passed.
        """
        settings = DeltaBackfillHook.for_job(job).s3_settings()
        if settings is None:
            return {}
        from airflow.sdk.log import mask_secret

        for secret in settings.secrets():
            mask_secret(secret)
        master = spark_master(self.spark_conn_id)
        if master.startswith(("yarn", "k8s://")):
            self.log.info("S3 tables on %s: the cluster's own S3A credentials apply (only the endpoint and "
                          "region of %s are passed)", master, job.aws_conn_id)
        else:
            self.env_vars = {**(self.env_vars or {}), **settings.environment()}
        return {f"spark.hadoop.{key}": value for key, value in settings.hadoop_conf(with_secrets=False).items()}

    def annotate_asset_events(self, context: Any, job: BackfillJob, watermark: int | None) -> None:
        """Put the watermark in the `extra` of each asset event this task emits, so a DAG
        scheduled on the MV knows which upstream epoch the MV reflects (the fields of
        `asset_events.event_extra`, which the MV's watcher sends too)."""
        outlet_events = context.get("outlet_events")
        if outlet_events is None:
            return
        from airflow_backfill.asset_events import event_extra

        extra = event_extra(DeltaBackfillHook.for_job(job), job=job.name, phase=self.phase, watermark=watermark)
        for outlet in self.outlets:
            if isinstance(outlet, Asset):
                outlet_events[outlet].extra = dict(extra)

    def after_commit(self, context: Any, watermark: int | None) -> None:
        """Extra XCom a phase publishes once its commit is read back."""

    def publish_progress_link(self, context: Any) -> None:
        """Airflow stores extra links when a task ends; a running phase links to its progress now."""
        for link in self.operator_extra_links:
            if isinstance(link, BackfillProgressLink):
                context["ti"].xcom_push(key=link.xcom_key, value=link.get_link(self, ti_key=context["ti"]))

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage (when its provider is installed): the upstream as input, the MV as
        output with column lineage, and the committed watermark as a run facet."""
        from airflow_backfill.lineage import phase_lineage

        watermark = getattr(self, "committed_watermark", None)
        if watermark is None:
            watermark = DeltaBackfillHook.for_job(self.job).watermark()
        return phase_lineage(self.job, self.phase, watermark)


class SnapshotBackfillOperator(_PhaseOperator):
    """Phase 1: create the MV from the upstream as of a pinned epoch, at the backfill parallelism.

    :param epoch: the upstream version to snapshot (templated; the DAG factory passes the
        `pinned_epoch` XComArg of its pin task). Unset: the upstream's latest version.
    :param epochs: for a join, the version of each upstream by name (templated; the DAG
        factory passes the `pinned_epochs` XComArg). Unset: each upstream's latest version.
    :param chunk_bytes: target input bytes per resumable chunk (default 256 MiB; 1 GiB for a
        join, whose chunks each read the other upstreams too).
    """

    phase = "snapshot"
    xcom_key = "snapshot_epoch"
    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "epoch", "epochs")

    def __init__(self, *, epoch: int | str | XComArg | None = None,
                 epochs: Mapping[str, int] | str | XComArg | None = None, chunk_bytes: int | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.epoch = epoch
        self.epochs = epochs
        self.chunk_bytes = chunk_bytes

    def phase_arguments(self, context: Any, overrides: Mapping[str, Any]) -> list[str]:
        arguments = []
        epochs = _optional(self.epochs, _versions)
        if epochs is not None:
            # name=version pairs (upstream names are SQL identifiers): the logged command
            # pastes into a shell as it is, as the job file does; JSON would lose its quotes
            arguments += ["--epochs", ",".join(f"{name}={version}" for name, version in sorted(epochs.items()))]
        epoch = _optional(self.epoch, int)
        if epoch is not None and epochs is None:
            arguments += ["--epoch", str(epoch)]
        if self.chunk_bytes is not None:
            arguments += ["--chunk-bytes", str(self.chunk_bytes)]
        return arguments


class LogStoreCatchUpOperator(_PhaseOperator):
    """Phase 2: apply the upstream's change feed in rounds until the lag is small.

    Besides `caught_up_epoch`, pushes `handover_version`: the upstream version against
    which catch-up measured its final lag (the sensor's reference).

    :param driver_jit: `auto` (default) starts the driver JVM with the quick JIT compiler
        alone when the pending change is at most 1 % of the upstream's rows, or the
        upstream holds at most a million rows, where it cuts a cold catch-up by about a
        quarter, and with the optimising one otherwise; `quick` and `full` force either.
        Java options of the user's that choose the compiler win.
    """

    phase = "catch_up"
    xcom_key = "caught_up_epoch"

    def __init__(self, *, driver_jit: str = AUTO, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.driver_jit = check_mode(driver_jit)

    def choose_jit(self, job: BackfillJob) -> None:
        choose_driver_jit(self, job, self.driver_jit)

    def after_commit(self, context: Any, watermark: int | None) -> None:
        from airflow_backfill.engine.job_state import read_state

        state = read_state(self.job.target)
        handover = state.get("catch_up_handover_version", watermark)
        if state.get("catch_up_converged") is False:
            self.log.warning("catch-up handed over to forward before converging (the upstream "
                             "writes faster than a round applies); forward continues from %s", watermark)
            handover = watermark
        context["ti"].xcom_push(key="handover_version", value=handover)


class MaintainMvOperator(_PhaseOperator):
    """Between catch-up and forward: compact the MV, cluster it by key and purge its
    deletion vectors (`airflow-backfill maintain`), at the backfill parallelism.

    :param vacuum: also VACUUM the MV at its own retention.
    :param max_file_size: largest file OPTIMIZE writes, in bytes (default: Delta's 1 GiB).
    """

    phase = "maintain"
    xcom_key = "maintained_epoch"

    def __init__(self, *, vacuum: bool = False, max_file_size: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        validate_optional_cap("max_file_size", max_file_size)
        self.vacuum = vacuum
        self.max_file_size = max_file_size

    def phase_arguments(self, context: Any, overrides: Mapping[str, Any]) -> list[str]:
        arguments = ["--vacuum"] if self.vacuum else []
        if self.max_file_size is not None:
            arguments += ["--max-file-size", str(self.max_file_size)]
        return arguments


DEFAULT_STOP_TIMEOUT = 4.0
"""Seconds forward gets to finish or abandon its commit once stopped. Airflow 3.3's task
supervisor sends SIGTERM to the task's whole process group (the task, spark-submit's JVM
and the Python driver) and SIGKILL 5 seconds later: the stop must fit inside that."""


class ForwardOperator(_PhaseOperator):
    """Phase 3: keep applying new upstream epochs at the normal parallelism.

    Runs until stopped, or until the bounds:
    :param max_epochs: stop once the watermark moved this many epochs (templated).
    :param idle_timeout: stop after this many seconds without a new epoch (templated).
    :param stop_timeout: seconds the driver gets, once the task is stopped or marked
        failed, to finish its commit; after that it exits and abandons the commit in
        flight (default 4: Airflow kills the task's process group 5 s after SIGTERM).
        Either way the MV stays exact: a Delta commit is atomic, so the MV is at its
        last committed watermark and the next run continues from there.
    `dag_run.conf` keys `forward_max_epochs` / `forward_idle_timeout` override both bounds.
    """

    phase = "forward"
    xcom_key = "forward_epoch"
    uses_backfill_parallelism = False
    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "max_epochs", "idle_timeout")

    def __init__(
        self,
        *,
        max_epochs: int | str | None = None,
        idle_timeout: float | str | None = None,
        stop_timeout: float = DEFAULT_STOP_TIMEOUT,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.max_epochs = max_epochs
        self.idle_timeout = idle_timeout
        self.stop_timeout = stop_timeout

    def on_kill(self) -> None:
        """Ask the driver to stop between commits, then let the provider end spark-submit.

        The driver (spark_jobs/forward.py, a descendant of this task's process) gets
        SIGTERM and `stop_timeout` seconds; it exits by itself at that deadline too
        (`--stop-grace`), so a commit that cannot finish in time is abandoned, not torn.
        """
        from airflow_backfill.process import stop_drivers

        self.log.info("stopping forward: SIGTERM to the driver, up to %.1f s to finish its commit",
                      self.stop_timeout)
        if not stop_drivers(os.getpid(), "forward.py", self.stop_timeout):
            self.log.warning("forward did not stop within %.1f s; its commit in flight is abandoned "
                             "(the MV stays at its last committed watermark)", self.stop_timeout)
        super().on_kill()

    def phase_arguments(self, context: Any, overrides: Mapping[str, Any]) -> list[str]:
        max_epochs = overrides.get("forward_max_epochs", _optional(self.max_epochs, int))
        idle_timeout = overrides.get("forward_idle_timeout", _optional(self.idle_timeout, float))
        arguments = ["--stop-grace", str(self.stop_timeout)]
        if max_epochs is not None:
            arguments += ["--max-epochs", str(max_epochs)]
        if idle_timeout is not None:
            arguments += ["--idle-timeout", str(idle_timeout)]
        return arguments


class VerifyOperator(_PhaseOperator):
    """Optional check after catch-up: recompute the query with Spark on the upstream as of
    the MV's watermark and compare it with the MV (`spark_jobs/verify.py`); the task fails
    when they differ, and its log names the first differing keys.

    :param key_ranges: hash ranges of the MV key compared by checksum (default 64).
    """

    phase = "verify"
    xcom_key = ""
    uses_backfill_parallelism = False

    def __init__(self, *, key_ranges: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.key_ranges = key_ranges

    def phase_arguments(self, context: Any, overrides: Mapping[str, Any]) -> list[str]:
        return [] if self.key_ranges is None else ["--key-ranges", str(self.key_ranges)]

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """A verification reads the upstream and the MV and writes nothing."""
        from airflow_backfill.lineage import verify_lineage

        return verify_lineage(self.job)
