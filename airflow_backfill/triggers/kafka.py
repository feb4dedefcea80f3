"""A trigger that waits, in the triggerer, until every split of a Kafka source backfill
is Finished: it reads the MV's and the source table's Delta logs and the topic's
partition list (no Spark), and serializes the pipeline as its plain mapping."""

from __future__ import annotations

from typing import Any

from airflow_backfill.triggers import DEFAULT_POLL_INTERVAL
from airflow_backfill.triggers.polling import Poll, PollingTrigger


class SplitsFinishedTrigger(PollingTrigger):
    """Fires once the MV's last commit records every partition of the topic as Finished:
    one event with `status` `success`, `timeout` or `error`, carrying `partitions` and
    the `waiting` ones (partition -> state) it saw last.

    :param pipeline: the Kafka pipeline as `KafkaPipeline.to_mapping()` returns it.
    """

    def __init__(
        self, pipeline: dict[str, Any], poll_interval: float = DEFAULT_POLL_INTERVAL, deadline: float | None = None,
    ) -> None:
        super().__init__(poll_interval, deadline)
        self.pipeline = pipeline

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {"pipeline": self.pipeline, "poll_interval": self.poll_interval, "deadline": self.deadline},
        )

    @property
    def subject(self) -> str:
        return f"the splits of Kafka source backfill {self.pipeline.get('backfill', {}).get('name')}"

    def check(self) -> Poll:
        from airflow_backfill.kafka.config import KafkaPipeline
        from airflow_backfill.kafka.status import unfinished_splits

        backfill = KafkaPipeline.from_mapping(self.pipeline, origin="trigger").backfill
        partitions, waiting = unfinished_splits(backfill)
        facts = {"partitions": partitions, "waiting": {str(p): state for p, state in waiting.items()}}
        if partitions and not waiting:
            return Poll(True, f"all {partitions} partitions of {backfill.upstream.topic} are Finished", facts)
        return Poll(False, f"{len(waiting)} of {partitions} partitions of {backfill.upstream.topic} are not "
                           f"Finished before the deadline: {waiting}", facts)
