"""Read what the phases committed straight from the Delta logs.

Operators, sensors and triggers need the MV's watermark and the upstream's latest
version. Both live in the Delta logs, so reading them needs neither Spark nor a parsed
task log, and works in the triggerer's event loop (through a thread).
"""

from __future__ import annotations

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
    """How far the MV trails its upstream, in epochs (Delta versions)."""

    upstream_version: int
    watermark: int | None

    @property
    def pending_epochs(self) -> int | None:
        """None while the MV does not exist (nothing is reflected yet)."""
        if self.watermark is None:
            return None
        return max(0, self.upstream_version - self.watermark)


class DeltaBackfillHook(BaseHook):
    """Delta-log reads for one job's upstream and MV.

    Local tables need no connection; tables on S3 are read with the credentials of
    `aws_conn_id` (an `aws` connection), or of the process's AWS_* environment without one.
    """

    hook_name = "Airflow Backfill (Delta logs)"

    def __init__(self, source: str, target: str, app_id: str, aws_conn_id: str | None = None) -> None:
        super().__init__()
        self.source = source
        self.target = target
        self.app_id = app_id
        self.aws_conn_id = aws_conn_id
        self._storage_ready = False

    @classmethod
    def for_job(cls, job: BackfillJob) -> DeltaBackfillHook:
        return cls(job.source, job.target, job.app_id, job.aws_conn_id)

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
            for uri in (self.source, self.target):
                if is_object_store(uri):
                    register_settings(uri, settings)
        self._storage_ready = True

    def check_upstream(self, version: int | None = None) -> int:
        """Validate the upstream (exists, Change Data Feed on, readable) and return its version."""
        from airflow_backfill.engine.delta.log import check_upstream

        self.register_storage()

        return check_upstream(self.source, version).version

    def upstream_version(self) -> int:
        """The upstream's latest committed version (its newest epoch)."""
        from airflow_backfill.engine.delta.log import latest_version

        self.register_storage()

        return latest_version(self.source)

    def watermark(self) -> int | None:
        """The upstream epoch the MV reflects, from its app transaction; None before the snapshot."""
        from airflow_backfill.engine.delta.log import read_watermark

        self.register_storage()

        return read_watermark(self.target, self.app_id)

    def lag(self, reference_version: int | None = None) -> Lag:
        """The lag against `reference_version`, or against the upstream's latest version."""
        upstream = self.upstream_version() if reference_version is None else reference_version
        return Lag(upstream_version=upstream, watermark=self.watermark())
