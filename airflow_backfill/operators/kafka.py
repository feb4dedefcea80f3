"""The Kafka source job and the source backfill as `spark-submit` tasks.

The pipeline travels to `spark_jobs/kafka_{source,backfill}.py` as a file (`--job FILE`,
see job_file.py), so the command in the task's log can be copied to rerun it by hand. After
spark-submit returns, the operators read the per-partition offsets from the Delta logs
(never from Spark's output) and push them to XCom.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from airflow_backfill.engine.delta.jars import delta_spark_conf
from airflow_backfill.kafka.config import KafkaPipeline
from airflow_backfill.operators.job_file import write_job_file
from airflow_backfill.operators.phases import entry_point


class _KafkaOperator(SparkSubmitOperator):
    entry: str = ""

    def __init__(self, *, pipeline: KafkaPipeline, conn_id: str = "spark_default", **kwargs: Any) -> None:
        self.pipeline = pipeline
        kwargs.setdefault("name", f"airflow_backfill-{pipeline.backfill.name}-{self.entry}")
        kwargs.setdefault("env_vars", {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable})
        super().__init__(application=entry_point(self.entry), conn_id=conn_id, **kwargs)

    def entry_arguments(self) -> list[str]:
        return []

    def submit(self, context: Any) -> None:
        self.pipeline.backfill.check_query()  # a clear error before spark-submit writes anything
        text = json.dumps(self.pipeline.to_mapping(), sort_keys=True)
        self.application_args = ["--job", write_job_file(self.pipeline.backfill.name, text), *self.entry_arguments()]
        self.conf = {**delta_spark_conf(), **(self.conf or {})}
        self._hook = None  # built from the arguments above
        super().execute(context)


class KafkaSourceJobOperator(_KafkaOperator):
    """Run the source job (the shared reader) until `idle_timeout` seconds pass without records.

    Pushes `source_offsets` (last committed offset per partition) to XCom.
    """

    entry = "kafka_source"
    ui_color = "#fdebd0"

    def __init__(self, *, idle_timeout: float | None = 10.0, max_rounds: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.idle_timeout = idle_timeout
        self.max_rounds = max_rounds

    def entry_arguments(self) -> list[str]:
        arguments = []
        if self.idle_timeout is not None:
            arguments += ["--idle-timeout", str(self.idle_timeout)]
        if self.max_rounds is not None:
            arguments += ["--max-rounds", str(self.max_rounds)]
        return arguments

    def execute(self, context: Any) -> None:
        from airflow_backfill.kafka.positions import source_position

        self.submit(context)
        offsets = {str(p): o for p, o in sorted(source_position(self.pipeline.source_job.table).offsets.items())}
        context["ti"].xcom_push(key="source_offsets", value=offsets)


class KafkaSourceBackfillOperator(_KafkaOperator):
    """Run the source backfill until every split is Finished (or `timeout` seconds).

    Pushes `split_offsets` and `split_states` (per partition) to XCom.
    """

    entry = "kafka_backfill"
    ui_color = "#d5f5e3"

    def __init__(self, *, timeout_seconds: float | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.timeout_seconds = timeout_seconds

    def entry_arguments(self) -> list[str]:
        return [] if self.timeout_seconds is None else ["--timeout", str(self.timeout_seconds)]

    def execute(self, context: Any) -> None:
        from airflow_backfill.kafka.positions import backfill_position

        self.submit(context)
        position = backfill_position(self.pipeline.backfill.target)
        offsets = {str(p): o for p, o in sorted(position.offsets.items())}
        context["ti"].xcom_push(key="split_offsets", value=offsets)
        context["ti"].xcom_push(key="split_states", value={str(p): str(s) for p, s in position.splits.items()})
