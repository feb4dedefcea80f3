"""Errors raised by airflow_backfill.

Every message names the problem and the fix. All of them are raised before any data
is written, so a failed run never leaves a half-written materialized view behind.
"""

from __future__ import annotations


class BackfillError(Exception):
    """Base class of every error this package raises on purpose."""


class BackfillConfigError(BackfillError, ValueError):
    """The job declaration (job file, DAG arguments or --conf overrides) is invalid."""


class UnsupportedQueryError(BackfillConfigError):
    """The MV query uses a construct the engine cannot maintain incrementally."""


class UpstreamError(BackfillError):
    """The upstream table cannot be backfilled from (missing, no change feed, ...)."""


class RepeatedKeyError(UpstreamError):
    """The upstream holds a primary key more than once: the MV would be wrong, so the
    phase refuses it (the snapshot's key proof, or a round's checks)."""

    def __init__(self, primary_key: list[str], source: str, what: str) -> None:
        super().__init__(
            f"primary key {primary_key} is not unique in the upstream: {what}. Fix the upstream {source} or "
            "declare its real primary key (or set verify_primary_key: false to keep one row per key); "
            "nothing was committed."
        )


class TargetError(BackfillError):
    """The target MV table is in a state this job cannot continue from."""


class WriterBusyError(TargetError):
    """Another run holds the MV's writer lock: nothing is wrong with the MV, only the turn
    is taken (a caller that shares its MVs, like the shared forward, tries again later)."""


class ServiceError(BackfillError, OSError):
    """A store or a broker could not serve this process: its address, the network, or the
    process's credentials or permissions. Nothing is known to be wrong with the tables or
    the topic themselves. An `OSError` as the failure it names was, so that a caller whose
    write is best effort (a heartbeat, a reader's registration) still catches it."""


class UnreachableError(ServiceError):
    """Nothing answered (connection refused, unknown host, timed out): a retry may help
    once the address is fixed or the service is back."""


class AccessDeniedError(ServiceError):
    """The service answered and refused this process (credentials or permissions): only
    a change of those helps."""


class ConsistencyError(BackfillError):
    """The tables asked for have no versions that agree as the policy asks, and never
    will: the epoch's versions were vacuumed or their log expired. Nothing was read."""


class NotYetConsistentError(ConsistencyError):
    """The tables do not agree as asked yet, but may later: an MV has not reached the
    epoch, has no committed version, or the MVs share no epoch yet. Waiting can help."""
