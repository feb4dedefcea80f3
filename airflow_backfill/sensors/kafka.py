"""Wait until every split of a Kafka source backfill is Finished (reads the MV's Delta log
and the topic's partition list only).

Deferrable when `[operators] default_deferrable` says so (or `deferrable=True`): the
wait then runs in the triggerer (`SplitsFinishedTrigger`), not in a worker slot.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_backfill.kafka.config import KafkaPipeline
from airflow_backfill.sensors.deferrable import DeferrableSensor

if TYPE_CHECKING:
    from airflow.triggers.base import BaseTrigger


class SplitsFinishedSensor(DeferrableSensor):
    """Succeeds once the MV's last commit records every partition of the topic as `Finished`.

    Partitions added to the topic after that commit count as not finished, so a topic that
    grew keeps the sensor waiting until the backfill took the new partitions too.

    :param pipeline: the Kafka pipeline whose backfill is waited for.

    `deferrable` and `trigger_poll_interval` as in `DeferrableSensor`.
    """

    ui_color = "#d4e6f1"

    def __init__(self, *, pipeline: KafkaPipeline, **kwargs: Any) -> None:
        kwargs.setdefault("poke_interval", 2.0)
        super().__init__(**kwargs)
        self.pipeline = pipeline

    def poke(self, context: Any) -> bool:
        from airflow_backfill.kafka.status import unfinished_splits

        partitions, waiting = unfinished_splits(self.pipeline.backfill)
        self.log.info("%s/%s partitions Finished; waiting: %s", partitions - len(waiting), partitions, waiting)
        return bool(partitions) and not waiting

    def make_trigger(self, deadline: float) -> BaseTrigger:
        from airflow_backfill.triggers.kafka import SplitsFinishedTrigger  # only where a task defers

        return SplitsFinishedTrigger(pipeline=self.pipeline.to_mapping(), poll_interval=self.trigger_poll_interval,
                                     deadline=deadline)

    def timeout_message(self, event: dict[str, Any]) -> str:
        return (
            f"Kafka source backfill {self.pipeline.backfill.name} did not finish within {float(self.timeout):g} s: "
            f"{event.get('message')}. Check the backfill task's log and `airflow-backfill kafka-status`."
        )
