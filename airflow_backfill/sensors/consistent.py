"""Wait until several MVs agree: versions that reflect the same upstream epochs, at least as
new as given ones; then hand those versions to the next task as XCom.

Deferrable when `[operators] default_deferrable` says so (or `deferrable=True`): the wait
then runs in the triggerer (ConsistentVersionsTrigger). It checks once before deferring.
The XCom (`return_value`) is the answer's plain form; a downstream task opens it with
`airflow_backfill.engine.consistency.readers` (delta-rs, Arrow or Spark).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import PokeReturnValue
from airflow.sdk.exceptions import AirflowException

from airflow_backfill.consistent_reads import Readable, as_readable, readable_uri, table_spec
from airflow_backfill.engine.consistency.answer import DEFAULT_HISTORY
from airflow_backfill.exceptions import BackfillConfigError
from airflow_backfill.job import BackfillJob
from airflow_backfill.sensors.deferrable import DeferrableSensor

if TYPE_CHECKING:
    from airflow.triggers.base import BaseTrigger

    from airflow_backfill.engine.consistency.tables import TableSpec


class ConsistentVersionsSensor(DeferrableSensor):
    """Succeeds once `tables` have versions that reflect the same upstream epochs (policy
    `common`), each epoch at or past `min_epochs`; returns those versions (XCom).

    :param tables: the MVs (and upstream tables) to read together: jobs, job files, Kafka
        pipelines or table URIs. Each is named explicitly: one still being created is
        waited for, not left out.
    :param min_epochs: the least epochs (templated): a version of the one upstream table,
        `{table: version}` (tables by URI or folder name), the text
        `orders=1200,customers=310`, or None for any agreement.
    :param history: versions of each MV searched at most for epochs they share.
    :param aws_conn_id: an `aws` connection for tables on S3 (default: the jobs' own, when
        they name one).

    `deferrable` and `trigger_poll_interval` as in `DeferrableSensor`.
    """

    template_fields: Sequence[str] = ("min_epochs",)
    ui_color = "#d5f5e3"

    def __init__(
        self,
        *,
        tables: Sequence[Readable],
        min_epochs: Any = None,
        history: int = DEFAULT_HISTORY,
        aws_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if isinstance(tables, str) or not tables:
            raise BackfillConfigError("tables must list the MVs to read together (jobs, job files or table URIs).")
        self.tables = [as_readable(table) for table in tables]
        self.min_epochs = min_epochs
        if isinstance(history, bool) or not isinstance(history, int) or history < 1:
            raise BackfillConfigError(f"history must be a positive number of versions, got {history!r}.")
        self.history = history
        self.aws_conn_id = aws_conn_id or _jobs_connection(self.tables)

    def specs(self) -> list[TableSpec]:
        """The tables' specs (table URIs are recognised from their logs: at run time only)."""
        if self.aws_conn_id is not None:
            from airflow_backfill.storage.s3_settings import register_settings, settings_from_connection
            from airflow_backfill.storage.uri import is_object_store

            settings = settings_from_connection(self.aws_conn_id)
            for table in self.tables:
                uri = readable_uri(table)
                if is_object_store(uri):
                    register_settings(uri, settings)
        return [table_spec(table) for table in self.tables]

    def minimum(self, specs: list[TableSpec]) -> dict[str, int]:
        """`min_epochs` as versions of base tables, by URI ({} when unset)."""
        value = self.min_epochs
        if value in (None, "", "None"):
            return {}
        from airflow_backfill.engine.consistency.epochs import resolve_epochs
        from airflow_backfill.engine.consistency.policies import base_tables

        return resolve_epochs(value, base_tables(specs), every_base=False)

    def poke(self, context: Any) -> bool | PokeReturnValue:
        from airflow_backfill.triggers.consistent import check_agreement

        specs = self.specs()
        poll = check_agreement(specs, self.minimum(specs), self.history, self.aws_conn_id)
        self.log.info("%s", poll.message)
        return PokeReturnValue(True, poll.facts["versions"]) if poll.done else False

    def make_trigger(self, deadline: float) -> BaseTrigger:
        from airflow_backfill.triggers.consistent import ConsistentVersionsTrigger

        specs = self.specs()
        return ConsistentVersionsTrigger(
            tables=[spec.to_dict() for spec in specs], min_epochs=self.minimum(specs), history=self.history,
            poll_interval=self.trigger_poll_interval, deadline=deadline, aws_conn_id=self.aws_conn_id,
        )

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> Any:
        """The versions the trigger found (XCom), or Airflow's exception for its other events."""
        super().execute_complete(context, event)
        versions = (event or {}).get("versions")
        if versions is None:
            raise AirflowException(f"the trigger of {self.task_id} succeeded without versions: {event!r}")
        return versions

    def timeout_message(self, event: dict[str, Any]) -> str:
        return (
            f"the tables did not agree at or past {self.min_epochs} within {float(self.timeout):g} s: "
            f"{event.get('message')}. Check that each MV's forward runs, or lower min_epochs."
        )


def _jobs_connection(tables: list[Any]) -> str | None:
    """The one `aws_conn_id` the jobs name, if any; refused when they name several."""
    named = {table.aws_conn_id for table in tables if isinstance(table, BackfillJob) and table.aws_conn_id}
    if len(named) > 1:
        raise BackfillConfigError(
            f"the jobs name different aws_conn_id ({', '.join(sorted(named))}); pass the one to read them all "
            "with as aws_conn_id."
        )
    return next(iter(named), None)
