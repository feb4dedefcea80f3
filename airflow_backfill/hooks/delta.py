"""Read what the phases committed straight from the Delta logs.

Operators, sensors and triggers need the MV's watermark and the upstream's latest
version. Both live in the Delta logs, so reading them needs neither Spark nor a parsed
task log, and works in the triggerer's event loop (through a thread).
"""

from __future__ import annotations

from dataclasses import dataclass

from airflow.sdk import BaseHook

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
    """Delta-log reads for one job's upstream and MV (local tables: no connection needed)."""

    hook_name = "Airflow Backfill (Delta logs)"

    def __init__(self, source: str, target: str, app_id: str) -> None:
        super().__init__()
        self.source = source
        self.target = target
        self.app_id = app_id

    def check_upstream(self, version: int | None = None) -> int:
        """Validate the upstream (exists, Change Data Feed on, readable) and return its version."""
        from airflow_backfill.engine.delta.log import check_upstream

        return check_upstream(self.source, version).version

    def upstream_version(self) -> int:
        """The upstream's latest committed version (its newest epoch)."""
        from airflow_backfill.engine.delta.log import latest_version

        return latest_version(self.source)

    def watermark(self) -> int | None:
        """The upstream epoch the MV reflects, from its app transaction; None before the snapshot."""
        from airflow_backfill.engine.delta.log import read_watermark

        return read_watermark(self.target, self.app_id)

    def lag(self, reference_version: int | None = None) -> Lag:
        """The lag against `reference_version`, or against the upstream's latest version."""
        upstream = self.upstream_version() if reference_version is None else reference_version
        return Lag(upstream_version=upstream, watermark=self.watermark())
