"""The Kafka source job and the source backfill as `spark-submit` tasks.

The pipeline travels to `spark_jobs/kafka_{source,backfill}.py` as a file (`--job FILE`,
see job_file.py), so the command in the task's log can be copied to rerun it by hand. It
names the brokers' connection, never its secrets: those reach spark-submit as one
environment variable (`kafka/connection.py`) and are masked in the task log. After
spark-submit returns, the operators read the per-partition offsets from the Delta logs
(never from Spark's output) and push them to XCom.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from airflow_backfill.engine.delta.jars import delta_spark_conf
from airflow_backfill.engine.parallelism import spark_conf_for
from airflow_backfill.hooks.spark_connection import spark_master
from airflow_backfill.kafka.config import KafkaPipeline
from airflow_backfill.kafka.liveness import BACKFILL_GRACE_S
from airflow_backfill.operators.driver_settings import hand_settings_to_driver
from airflow_backfill.operators.job_file import write_job_file
from airflow_backfill.operators.jvm_archive_launch import start_driver_on_archive
from airflow_backfill.operators.phases import entry_point
from airflow_backfill.serialized_job import SerializesPipeline


class _KafkaOperator(SerializesPipeline, SparkSubmitOperator):
    entry: str = ""

    def __init__(self, *, pipeline: KafkaPipeline, conn_id: str = "spark_default", **kwargs: Any) -> None:
        self.pipeline = pipeline
        kwargs.setdefault("name", f"airflow_backfill-{pipeline.backfill.name}-{self.entry}")
        kwargs.setdefault("env_vars", {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable})
        super().__init__(application=entry_point(self.entry), conn_id=conn_id, **kwargs)
        self.spark_conn_id = conn_id

    def entry_arguments(self) -> list[str]:
        return []

    def parallelism(self) -> int:
        return self.pipeline.backfill.backfill_parallelism

    def prepare(self) -> None:
        """Arguments, Spark settings and environment of this task's spark-submit."""
        self.pipeline.backfill.check_query()  # a clear error before spark-submit writes anything
        self.application_args = ["--job", self.pipeline_file(), *self.entry_arguments()]
        master = spark_master(self.spark_conn_id)
        # On a cluster each application takes at most its parallelism's cores, so a source
        # job and a backfill running side by side never wait for each other's executors.
        sizing = spark_conf_for(self.parallelism(), master)
        sizing.pop("spark.master", None)
        self.conf = {**delta_spark_conf(), **sizing, **(self.conf or {})}
        self.env_vars = {**(self.env_vars or {}), **self.broker_environment(master)}
        hand_settings_to_driver(self)
        start_driver_on_archive(self, self.spark_conn_id)
        self._hook = None  # built from the arguments above

    def pipeline_file(self) -> str:
        """The pipeline in a job file beside the task logs (`--job FILE`): it names the
        brokers' connection, never its settings."""
        return write_job_file(self.pipeline.backfill.name, json.dumps(self.pipeline.to_mapping(), sort_keys=True))

    def broker_environment(self, master: str) -> dict[str, str]:
        """The brokers' connection for the driver, as an environment variable (never `--conf`)."""
        upstream = self.pipeline.backfill.upstream
        if not upstream.kafka_conn_id:
            return {}
        from airflow.sdk.log import mask_secret

        from airflow_backfill.kafka.connection import ENVIRONMENT, settings_from_connection

        settings = settings_from_connection(upstream.kafka_conn_id)
        for secret in settings.secrets():
            mask_secret(secret)
        if master.startswith(("yarn", "k8s://")):
            # These masters receive environment variables only through --conf, which any
            # process list shows: the driver resolves the connection itself there.
            self.log.info("Kafka connection %s: resolved by the driver on %s", upstream.kafka_conn_id, master)
            return {}
        return {ENVIRONMENT: settings.to_json()}

    def submit(self, context: Any) -> None:
        self.prepare()
        super().execute(context)


class KafkaSourceJobOperator(_KafkaOperator):
    """Run the source job (the shared reader): unbounded by default, as the long-running task
    that ingests the topic; bounded by `idle_timeout`, `max_rounds` or `beside_backfill`.

    One source job ingests a table at a time: started while another runs, this one waits
    as a standby and takes over when the other stops.

    :param beside_backfill: stop once the pipeline's backfill has every split Finished, or
        once no backfill of it has been running for `backfill_grace` seconds.

    Pushes `source_offsets` (last committed offset per partition) to XCom.
    """

    entry = "kafka_source"
    ui_color = "#fdebd0"

    def __init__(
        self, *, idle_timeout: float | None = None, max_rounds: int | None = None, beside_backfill: bool = False,
        backfill_grace: float = BACKFILL_GRACE_S, **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.idle_timeout = idle_timeout
        self.max_rounds = max_rounds
        self.beside_backfill = beside_backfill
        self.backfill_grace = backfill_grace

    def parallelism(self) -> int:
        return self.pipeline.source_job.parallelism

    def entry_arguments(self) -> list[str]:
        arguments = []
        if self.idle_timeout is not None:
            arguments += ["--idle-timeout", str(self.idle_timeout)]
        if self.max_rounds is not None:
            arguments += ["--max-rounds", str(self.max_rounds)]
        if self.beside_backfill:
            arguments += ["--beside-backfill", "--backfill-grace", str(self.backfill_grace)]
        return arguments

    def execute(self, context: Any) -> None:
        from airflow_backfill.kafka.positions import source_position

        self.submit(context)
        offsets = {str(p): o for p, o in sorted(source_position(self.pipeline.source_job.table).offsets.items())}
        context["ti"].xcom_push(key="source_offsets", value=offsets)


class KafkaSourceBackfillOperator(_KafkaOperator):
    """Run the source backfill until every split is Finished (or `timeout_seconds`).

    :param start_source_job: while the backfill runs and no source job has been running
        for `source_job_grace` seconds, start one beside it (a second spark-submit of this
        task, bounded by this backfill) and start it again if it dies. Its heartbeat and
        the source table's lock record it, so it never runs next to another source job.

    Pushes `split_offsets` and `split_states` (per partition) to XCom.
    """

    entry = "kafka_backfill"
    ui_color = "#d5f5e3"

    def __init__(
        self, *, timeout_seconds: float | None = None, start_source_job: bool = False,
        source_job_grace: float = 15.0, **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.timeout_seconds = timeout_seconds
        self.start_source_job = start_source_job
        self.source_job_grace = source_job_grace
        self._companion: SourceJobBeside | None = None

    def entry_arguments(self) -> list[str]:
        return [] if self.timeout_seconds is None else ["--timeout", str(self.timeout_seconds)]

    def execute(self, context: Any) -> None:
        from airflow_backfill.kafka.positions import backfill_position

        self.prepare()
        if self.start_source_job:
            self._companion = SourceJobBeside(self, grace=self.source_job_grace)
            self._companion.start()
        try:
            SparkSubmitOperator.execute(self, context)
        finally:
            if self._companion is not None:
                self._companion.stop()
        position = backfill_position(self.pipeline.backfill.target)
        offsets = {str(p): o for p, o in sorted(position.offsets.items())}
        context["ti"].xcom_push(key="split_offsets", value=offsets)
        context["ti"].xcom_push(key="split_states", value={str(p): str(s) for p, s in position.splits.items()})

    def on_kill(self) -> None:
        if self._companion is not None:
            self._companion.stop(wait=0.0)
        super().on_kill()


class SourceJobBeside:
    """The source job a backfill task runs beside its backfill while no other one runs.

    A thread watches the source job's heartbeat: after `grace` seconds without a running
    source job it starts one (`kafka_source.py --beside-backfill`, with the backfill task's
    connection, settings and environment), and starts it again at once when it fails
    (killed, or an error) while the backfill runs. Stopping waits for it to end by its
    bound (every split Finished), then kills it.
    """

    def __init__(self, backfill: KafkaSourceBackfillOperator, grace: float, poll_interval: float = 2.0) -> None:
        self.backfill = backfill
        self.grace = grace
        self.poll_interval = poll_interval
        self.starts = 0
        self._stop = threading.Event()
        self._hook: SparkSubmitHook | None = None
        self._thread = threading.Thread(target=self._run, name="source-job-beside-backfill", daemon=True)

    @property
    def log(self) -> Any:
        return self.backfill.log

    def start(self) -> None:
        self._thread.start()

    def stop(self, wait: float = 120.0) -> None:
        """Let a running source job end by its bound (at most `wait` seconds), then kill it."""
        self._stop.set()
        self._thread.join(timeout=wait)
        if self._thread.is_alive() and self._hook is not None:
            self.log.warning("the source job beside the backfill did not stop within %.0f s: killing it", wait)
            self._hook.on_kill()
            self._thread.join(timeout=30)

    def _needed(self) -> bool:
        from airflow_backfill.kafka.liveness import SOURCE_JOB, running

        return running(self.backfill.pipeline.source_job.table, SOURCE_JOB) is None

    def _run(self) -> None:
        absent_since: float | None = None
        failed = False
        while not self._stop.wait(self.poll_interval):
            if failed:
                self.starts += 1
                self.log.warning("starting the source job beside the backfill again (start %s)", self.starts)
            else:
                if not self._needed():
                    absent_since = None
                    continue
                absent_since = absent_since or time.monotonic()
                if time.monotonic() - absent_since < self.grace:
                    continue
                self.starts += 1
                self.log.warning("no source job has been running for %.0f s beside the backfill: starting one "
                                 "(start %s)", time.monotonic() - absent_since, self.starts)
            failed = not self._submit()
            absent_since = None

    def _submit(self) -> bool:
        """Run one source job to its end; False when it failed (killed, or an error)."""
        from airflow.sdk.exceptions import AirflowException

        operator = self.backfill
        arguments = ["--job", operator.pipeline_file(), "--beside-backfill",
                     "--backfill-grace", str(max(60.0, 4 * self.grace))]
        self._hook = SparkSubmitHook(
            conf=operator.conf, conn_id=operator.spark_conn_id, name=f"airflow_backfill-{operator.pipeline.source_job.name}"
            "-kafka_source", application_args=arguments, env_vars=operator.env_vars,
            properties_file=operator.properties_file, verbose=False,
        )
        try:
            self._hook.submit(entry_point("kafka_source"))
        except AirflowException as error:
            self.log.warning("the source job beside the backfill failed (%s)", error)
            return False
        self.log.info("the source job beside the backfill stopped")
        return True
