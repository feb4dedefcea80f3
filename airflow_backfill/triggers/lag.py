"""A trigger that waits, in the triggerer, until an MV is within N epochs of its upstream.

It polls only the two Delta logs (delta-rs, no Spark) and serializes to plain values so
the triggerer can rebuild it; polling, the absolute deadline and the events are
`PollingTrigger`'s.
"""

from __future__ import annotations

from typing import Any

from airflow_backfill.hooks.delta import DeltaBackfillHook
from airflow_backfill.triggers import DEFAULT_POLL_INTERVAL
from airflow_backfill.triggers.polling import Poll, PollingTrigger


class CaughtUpTrigger(PollingTrigger):
    """Fires once pending epochs <= `lag_threshold`: a single event with `status`
    `success`, `timeout` (the deadline passed) or `error` (the tables cannot be read),
    carrying the watermark, upstream version and pending epochs it saw last.

    Pending epochs are counted against `reference_version` when given (the upstream
    version at which catch-up handed over), else against the upstream's latest version.

    :param source: the upstream's URI, or for a join each upstream's URI by name (its
        events then count epochs as sums over the upstreams and add `upstream_lags`).
    :param deadline: a POSIX timestamp (seconds) after which the trigger reports
        `timeout`; None waits without a deadline.
    :param aws_conn_id: the job's `aws` connection, for tables on S3 (read in the triggerer).
    """

    def __init__(
        self,
        source: str | dict[str, str],
        target: str,
        app_id: str,
        lag_threshold: int,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        reference_version: int | None = None,
        deadline: float | None = None,
        aws_conn_id: str | None = None,
    ) -> None:
        super().__init__(poll_interval, deadline)
        self.aws_conn_id = aws_conn_id
        self.source = source
        self.target = target
        self.app_id = app_id
        self.lag_threshold = lag_threshold
        self.reference_version = reference_version

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "source": self.source,
                "target": self.target,
                "app_id": self.app_id,
                "lag_threshold": self.lag_threshold,
                "poll_interval": self.poll_interval,
                "reference_version": self.reference_version,
                "deadline": self.deadline,
                "aws_conn_id": self.aws_conn_id,
            },
        )

    @property
    def subject(self) -> str:
        return f"the lag of MV {self.target}"

    def check(self) -> Poll:
        lag = DeltaBackfillHook(self.source, self.target, self.app_id, self.aws_conn_id).lag(self.reference_version)
        pending = lag.pending_epochs
        facts: dict[str, Any] = {"watermark": lag.watermark, "upstream_version": lag.upstream_version,
                                 "pending_epochs": pending}
        if lag.upstream_lags is not None:
            facts["upstream_lags"] = lag.upstream_lags
        if pending is not None and pending <= self.lag_threshold:
            return Poll(True, f"MV {self.target} caught up: watermark {lag.watermark}, pending epochs {pending}",
                        facts)
        return Poll(False, f"MV {self.target} did not catch up before its deadline: watermark {lag.watermark}, "
                           f"upstream {lag.upstream_version}, pending epochs {pending} > {self.lag_threshold}",
                    facts)
