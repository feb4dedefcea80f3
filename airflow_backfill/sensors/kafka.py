"""Wait until every split of a Kafka source backfill is Finished (reads the MV's Delta log only)."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseSensorOperator

from airflow_backfill.kafka.config import KafkaPipeline


class SplitsFinishedSensor(BaseSensorOperator):
    """Succeeds once the MV's last commit records every partition of the topic as `Finished`.

    Partitions added to the topic after that commit count as not finished, so a topic that
    grew keeps the sensor waiting until the backfill took the new partitions too.
    """

    ui_color = "#d4e6f1"

    def __init__(self, *, pipeline: KafkaPipeline, **kwargs: Any) -> None:
        kwargs.setdefault("poke_interval", 2.0)
        super().__init__(**kwargs)
        self.pipeline = pipeline

    def poke(self, context: Any) -> bool:
        from airflow_backfill.kafka.split_state import FINISHED
        from airflow_backfill.kafka.status import split_statuses

        statuses = split_statuses(self.pipeline.backfill)
        waiting = {s.partition: str(s.state) for s in statuses if s.state.kind != FINISHED}
        self.log.info("%s/%s partitions Finished; waiting: %s", len(statuses) - len(waiting), len(statuses), waiting)
        return bool(statuses) and not waiting
