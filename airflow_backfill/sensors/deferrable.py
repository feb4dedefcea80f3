"""What the provider's sensors share: check once, then either poke from a worker or defer
to a trigger in the triggerer, and turn the trigger's event into success or Airflow's
exceptions."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from airflow.configuration import conf
from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.exceptions import AirflowException, AirflowSensorTimeout
from airflow.triggers.base import BaseTrigger

from airflow_backfill.triggers import DEFAULT_POLL_INTERVAL


class DeferrableSensor(BaseSensorOperator):
    """Base of the provider's sensors. Subclasses implement `poke`, `make_trigger` (the trigger
    to defer to, given its absolute deadline) and `timeout_message` (what a timeout event
    says, naming what to check).

    :param deferrable: wait in the triggerer instead of poking from a worker (default:
        the `[operators] default_deferrable` setting).
    :param trigger_poll_interval: seconds between the trigger's checks (default 10: a
        triggerer serves many sensors; `poke_interval` is the worker's).
    """

    def __init__(
        self,
        *,
        deferrable: bool | None = None,
        trigger_poll_interval: float = DEFAULT_POLL_INTERVAL,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if deferrable is None:  # read when the DAG is parsed, so the deployment's setting applies
            deferrable = conf.getboolean("operators", "default_deferrable", fallback=False)
        self.deferrable = deferrable
        self.trigger_poll_interval = trigger_poll_interval

    def make_trigger(self, deadline: float) -> BaseTrigger:
        raise NotImplementedError

    def timeout_message(self, event: dict[str, Any]) -> str:
        raise NotImplementedError

    def execute(self, context: Any) -> Any:
        if not self.deferrable:
            return super().execute(context)
        poked = self.poke(context)
        if poked:  # already there: no deferral at all
            return poked.xcom_value if isinstance(poked, PokeReturnValue) else None
        timeout = float(self.timeout)
        self.defer(trigger=self.make_trigger(time.time() + timeout), method_name="execute_complete",
                   timeout=timedelta(seconds=timeout))

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> None:
        """Resume after the trigger: succeed on `success`, raise Airflow's exception otherwise."""
        event = event or {}
        status = event.get("status")
        if status == "success":
            self.log.info("%s", event.get("message"))
            return
        if status == "timeout":
            raise AirflowSensorTimeout(self.timeout_message(event))
        if status == "error":
            raise AirflowException(event.get("message"))
        raise AirflowException(f"unexpected event from the trigger of {self.task_id}: {event!r}")
