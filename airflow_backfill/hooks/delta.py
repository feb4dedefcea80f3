"""Read what the phases committed straight from the Delta logs.

Operators, sensors and triggers need the MV's watermark and the upstream's latest
version. Both live in the Delta logs, so reading them needs neither Spark nor a parsed
task log, and works in the triggerer's event loop (through a thread).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow.sdk import BaseHook

if TYPE_CHECKING:
    from airflow_backfill.job import BackfillJob
    from airflow_backfill.storage.s3_settings import S3Settings

# delta-rs and pyarrow are imported by the methods that read a log, not here: DAG files
# import this module through the operators, and every parse would pay for them.


@dataclass(frozen=True)
class Lag:
    """How far the MV trails its upstream, in epochs (Delta versions). For a join both
    numbers are sums over its upstreams (the scale of its app transaction) and
    `upstream_lags` splits the pending epochs by upstream."""

    upstream_version: int
    watermark: int | None
    upstream_lags: dict[str, int] | None = None
    """A join's pending epochs per upstream (None for one upstream, or before the MV exists)."""

    @property
    def pending_epochs(self) -> int | None:
        """None while the MV does not exist (nothing is reflected yet)."""
        if self.watermark is None:
            return None
        return max(0, self.upstream_version - self.watermark)


WATCHED_PHASES = frozenset({"forward"})
"""The phases whose commits the MV's watcher reports: a forward (the shared one or one MV's
task) commits for as long as it lives, and no task end reports its commits; the snapshot
and catch-up tasks report theirs when they end, and the MV is being created until then."""
FIRST_SCAN_DEPTH = 1000
"""Commits read back from the newest at a watcher's first read, to find the newest commit
that set the watermark (maintenance commits carry none)."""
MAX_SCAN = 10_000
"""Commits read at most in one scan; a scan after a long pause reads the newest ones."""


@dataclass(frozen=True)
class WatermarkCommit:
    """One MV commit that moved the watermark."""

    version: int
    watermark: int
    phase: str | None
    committed_at: int | None
    """When it was committed (its commitInfo timestamp, ms since the epoch)."""


@dataclass(frozen=True)
class CommitScan:
    """What one read of the MV's log found after a known version."""

    newest: int
    """The MV's newest version read: where the next scan starts."""
    watermark: int | None
    """The MV's watermark as of `newest` (None: the MV is being created)."""
    moved: tuple[WatermarkCommit, ...]
    """The commits of `WATCHED_PHASES` that moved the watermark, oldest first."""
    restarted: bool = False
    """The scan started over from the newest version (a first scan, or the known version's
    log entry is gone: the table was recreated): `moved` holds the newest such commit only."""


class DeltaBackfillHook(BaseHook):
    """Delta-log reads for one job's upstream (or a join's upstreams) and MV.

    `source` is the upstream's URI, or for a join a mapping of each upstream's name to
    its URI. Local tables need no connection; tables on S3 are read with the credentials of
    `aws_conn_id` (an `aws` connection), or of the process's AWS_* environment without one.
    """

    hook_name = "Airflow Backfill (Delta logs)"

    def __init__(self, source: str | Mapping[str, str], target: str, app_id: str,
                 aws_conn_id: str | None = None) -> None:
        super().__init__()
        self.source = source
        self.target = target
        self.app_id = app_id
        self.aws_conn_id = aws_conn_id
        self._storage_ready = False

    @classmethod
    def for_job(cls, job: BackfillJob) -> DeltaBackfillHook:
        return cls(job_source(job), job.target, job.app_id, job.aws_conn_id)

    @property
    def is_join(self) -> bool:
        return isinstance(self.source, Mapping)

    @property
    def upstreams(self) -> dict[str, str]:
        """Each upstream's URI by its name (`source` for one upstream)."""
        return dict(self.source) if isinstance(self.source, Mapping) else {"source": self.source}

    def s3_settings(self) -> S3Settings | None:
        """The S3 settings of `aws_conn_id` (None without one)."""
        if self.aws_conn_id is None:
            return None
        from airflow_backfill.storage.s3_settings import settings_from_connection

        return settings_from_connection(self.aws_conn_id)

    def register_storage(self) -> None:
        """Register the connection's settings for the job's S3 tables, once per hook."""
        if self._storage_ready:
            return
        from airflow_backfill.storage.s3_settings import register_settings
        from airflow_backfill.storage.uri import is_object_store

        settings = self.s3_settings()
        if settings is not None:
            for uri in (*self.upstreams.values(), self.target):
                if is_object_store(uri):
                    register_settings(uri, settings)
        self._storage_ready = True

    def check_upstream(self, version: int | None = None, *, key: Sequence[str] = ()) -> int:
        """Validate the upstream (exists, Change Data Feed on, readable, holds the `key`
        columns as written) and return its version (a join: every upstream at its latest
        version, and the sum of their versions)."""
        if self.is_join:
            return sum(self.check_upstreams().values())
        from airflow_backfill.engine.delta.log import check_upstream
        from airflow_backfill.engine.delta.vacuumed import check_not_vacuumed

        self.register_storage()
        info = check_upstream(self.upstreams["source"], version, key=key)
        if version is not None:  # an epoch a person chose: refused now if VACUUM removed part of it
            check_not_vacuumed(info.uri, info.version)
        return info.version

    def check_upstreams(self) -> dict[str, int]:
        """Validate every upstream as `check_upstream` does; each one's latest version."""
        from airflow_backfill.engine.delta.log import check_upstream

        self.register_storage()
        return {name: check_upstream(uri).version for name, uri in self.upstreams.items()}

    def upstream_version(self) -> int:
        """The upstream's latest committed version (its newest epoch; a join: their sum)."""
        return sum(self.upstream_versions().values())

    def upstream_versions(self) -> dict[str, int]:
        """Each upstream's latest committed version, by name."""
        from airflow_backfill.engine.delta.log import latest_version

        self.register_storage()
        return {name: latest_version(uri) for name, uri in self.upstreams.items()}

    def watermark(self) -> int | None:
        """The upstream epoch the MV reflects, from its app transaction (a join: the sum of
        its upstreams' versions); None before the snapshot."""
        from airflow_backfill.engine.delta.log import read_watermark

        self.register_storage()

        return read_watermark(self.target, self.app_id)

    def watermarks(self, up_to: int | None = None) -> dict[str, int] | None:
        """The version of each upstream the MV reflects (as of its version `up_to`, else its
        latest), by name; None before the snapshot. A join's vector is read from its newest
        commit that carries one and checked against the watermark."""
        if not self.is_join:
            watermark = self.watermark() if up_to is None else self._watermark_at(up_to)
            return None if watermark is None else {"source": watermark}
        from airflow_backfill.engine.joins.watermarks import table_vector

        self.register_storage()
        return table_vector(self.target, self.app_id, list(self.upstreams), up_to=up_to)

    def _watermark_at(self, version: int) -> int | None:
        from airflow_backfill.engine.delta.log import table_at

        self.register_storage()
        return table_at(self.target, version).transaction_version(self.app_id)

    def feed_readers(self) -> list[str] | None:
        """The readers that read the MV's change feed exactly, from its table property
        (`airflow_backfill.feedReaders`); None before the MV exists or without the property."""
        from airflow_backfill.engine.feed_readers import recorded_feed_readers

        self.register_storage()
        return recorded_feed_readers(self.target)

    def watermark_commits(self, after: int | None, watermark: int | None = None) -> CommitScan | None:
        """The commits after MV version `after` that moved the watermark (above `watermark`,
        the one `after` records when None); None while the MV does not exist. Each poll
        asks whether the next commit file exists (a listing of a log that grows by a commit
        a second would cost more every poll) and reads only the new log entries."""
        from airflow_backfill.engine.consistency.history import read_commit
        from airflow_backfill.engine.delta.log import table_exists
        from airflow_backfill.engine.delta.log_state import commit_file
        from airflow_backfill.storage import files

        self.register_storage()
        if not table_exists(self.target):
            return None
        if after is None or not files.exists(commit_file(self.target, after)):
            return self._newest_watermark_commit()
        if watermark is None:
            known = read_commit(self.target, after, self.app_id)
            watermark = None if known is None else known.txn
        newest = after
        while files.exists(commit_file(self.target, newest + 1)):
            newest += 1
        moved: list[WatermarkCommit] = []
        for version in range(max(after + 1, newest - MAX_SCAN + 1), newest + 1):
            commit = read_commit(self.target, version, self.app_id)
            if commit is None or commit.txn is None or (watermark is not None and commit.txn <= watermark):
                continue
            watermark = commit.txn
            if commit.metadata.get("phase") in WATCHED_PHASES:
                moved.append(self._watermark_commit(version, commit.txn, commit.metadata))
        return CommitScan(newest, watermark, tuple(moved))

    def commit_of(self, watermark: int) -> int | None:
        """The MV version whose commit set `watermark`, searched back from the newest: what
        a phase's event names, even when another writer (the shared forward) committed
        after the phase read its watermark. None when the newest commits do not tell."""
        from airflow_backfill.engine.consistency.history import read_commit
        from airflow_backfill.engine.delta.log import latest_version, table_exists

        self.register_storage()
        if not table_exists(self.target):
            return None
        newest = latest_version(self.target)
        for version in range(newest, max(-1, newest - FIRST_SCAN_DEPTH), -1):
            commit = read_commit(self.target, version, self.app_id)
            if commit is None or (commit.txn is not None and commit.txn < watermark):
                return None
            if commit.txn == watermark:
                return version
        return None

    def _newest_watermark_commit(self) -> CommitScan:
        """A scan from the newest version back to the newest commit that set the watermark."""
        from airflow_backfill.engine.consistency.history import read_commit
        from airflow_backfill.engine.delta.log import latest_version

        newest = latest_version(self.target)
        for version in range(newest, max(-1, newest - FIRST_SCAN_DEPTH), -1):
            commit = read_commit(self.target, version, self.app_id)
            if commit is None:
                break  # older entries are gone too
            if commit.txn is not None:
                watched = commit.metadata.get("phase") in WATCHED_PHASES
                moved = (self._watermark_commit(version, commit.txn, commit.metadata),) if watched else ()
                return CommitScan(newest, commit.txn, moved, restarted=True)
        return CommitScan(newest, self._watermark_at(newest), (), restarted=True)

    def _watermark_commit(self, version: int, watermark: int, metadata: Mapping[str, object]) -> WatermarkCommit:
        from airflow_backfill.engine.delta.log import commit_timestamp

        phase = metadata.get("phase")
        return WatermarkCommit(version, watermark, phase if isinstance(phase, str) else None,
                               commit_timestamp(self.target, version))

    def lag(self, reference_version: int | None = None) -> Lag:
        """The lag against `reference_version`, or against the upstream's latest version
        (a join: its upstreams' latest versions, and the lag of each)."""
        if not self.is_join:
            upstream = self.upstream_version() if reference_version is None else reference_version
            return Lag(upstream_version=upstream, watermark=self.watermark())
        latest = self.upstream_versions()
        watermarks = self.watermarks()
        upstream = sum(latest.values()) if reference_version is None else reference_version
        if watermarks is None:
            return Lag(upstream_version=upstream, watermark=None)
        lags = {name: max(0, latest[name] - version) for name, version in watermarks.items()}
        return Lag(upstream_version=upstream, watermark=sum(watermarks.values()), upstream_lags=lags)


def job_source(job: BackfillJob) -> str | dict[str, str]:
    """What the hook (and the trigger) take as `source`: the upstream's URI, or for a join
    each upstream's URI by name."""
    if job.is_join:
        return {upstream.name: upstream.table for upstream in job.upstreams}
    return job.source
