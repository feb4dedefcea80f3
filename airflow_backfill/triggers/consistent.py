"""A trigger that waits, in the triggerer, until several MVs share epochs at least as new as
given ones, and hands over the versions that agree.

It reads only the Delta logs (delta-rs, no Spark); the tables travel as plain specs, so
the triggerer rebuilds it from `serialize()`. Polling, the absolute deadline and the
events are `PollingTrigger`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_backfill.triggers import DEFAULT_POLL_INTERVAL
from airflow_backfill.triggers.polling import Poll, PollingTrigger

if TYPE_CHECKING:
    from airflow_backfill.engine.consistency.tables import TableSpec


class ConsistentVersionsTrigger(PollingTrigger):
    """Fires once the tables' agreeing versions (policy `common`) reflect epochs at or past
    `min_epochs`: a single event with `status` `success` (with `versions`, the answer's
    plain form), `timeout` (the deadline passed; with the newest agreeing epochs seen, if
    any) or `error` (a table cannot be read, or its versions are gone).

    :param tables: each table's spec as plain values (`TableSpec.to_dict()`).
    :param min_epochs: the least epoch of each base table, by URI ({}: any agreement).
    :param history: versions of each MV searched at most.
    :param deadline: a POSIX timestamp (seconds) after which the trigger reports `timeout`;
        None waits without a deadline.
    :param aws_conn_id: an `aws` connection for tables on S3 (read in the triggerer).
    """

    def __init__(
        self,
        tables: list[dict[str, Any]],
        min_epochs: dict[str, int],
        history: int,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        deadline: float | None = None,
        aws_conn_id: str | None = None,
    ) -> None:
        super().__init__(poll_interval, deadline)
        self.tables = tables
        self.min_epochs = min_epochs
        self.history = history
        self.aws_conn_id = aws_conn_id

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "tables": self.tables,
                "min_epochs": self.min_epochs,
                "history": self.history,
                "poll_interval": self.poll_interval,
                "deadline": self.deadline,
                "aws_conn_id": self.aws_conn_id,
            },
        )

    @property
    def subject(self) -> str:
        return "the versions of " + ", ".join(str(table["name"]) for table in self.tables)

    def check(self) -> Poll:
        from airflow_backfill.engine.consistency.tables import TableSpec

        specs = [TableSpec.from_dict(table) for table in self.tables]
        return check_agreement(specs, self.min_epochs, self.history, self.aws_conn_id)


def check_agreement(specs: Sequence[TableSpec], min_epochs: Mapping[str, int], history: int,
                    aws_conn_id: str | None = None) -> Poll:
    """One check of the sensor and the trigger: done once the tables agree (policy `common`)
    at epochs at or past `min_epochs`; the facts carry the answer (`versions`) or why not.

    Raises BackfillError (an error event) only when waiting cannot help: a table that is
    not what its spec says, or agreeing versions that were vacuumed.
    """
    from airflow_backfill.engine.consistency.epochs import at_least
    from airflow_backfill.engine.consistency.policies import consistent_versions
    from airflow_backfill.exceptions import NotYetConsistentError

    if aws_conn_id is not None:
        _register_storage(specs, aws_conn_id)
    names = ", ".join(spec.name for spec in specs)
    try:
        answer = consistent_versions(specs, history=history)
    except NotYetConsistentError as error:
        return Poll(False, f"{names} do not agree yet: {error}", {"reason": str(error)})
    facts = {"epochs": answer.epochs}
    if not at_least(answer.epochs, min_epochs):
        return Poll(False, f"{names} agree at {answer.epochs}, not yet at or past {dict(min_epochs)}", facts)
    return Poll(True, f"{names} agree at {answer.epochs}", {**facts, "versions": answer.to_dict()})


def _register_storage(specs: Sequence[TableSpec], aws_conn_id: str) -> None:
    """The connection's settings for the tables' buckets (and their upstreams')."""
    from airflow_backfill.storage.s3_settings import register_settings, settings_from_connection
    from airflow_backfill.storage.uri import is_object_store

    settings = settings_from_connection(aws_conn_id)
    for spec in specs:
        for uri in (spec.uri, *spec.upstreams.values()):
            if is_object_store(uri):
                register_settings(uri, settings)
