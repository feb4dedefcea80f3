"""The range of upstream epochs one MV commit applied, and the MV's watermark it starts from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_backfill.engine.delta.log import read_watermark
from airflow_backfill.exceptions import TargetError

if TYPE_CHECKING:
    from airflow_backfill.job import BackfillJob


@dataclass(frozen=True)
class AppliedRange:
    """One MV commit of the upstream epochs (start_watermark, end_version]."""

    start_watermark: int
    end_version: int
    change_rows: int
    mv_rows_changed: int
    seconds: float
    plan: str = ""
    """How the range was written (`planning/round_plan.py`): append, replace, merge,
    overwrite or recompute; for an aggregate, how its state and MV were."""

    @property
    def epochs(self) -> int:
        return self.end_version - self.start_watermark


def current_watermark(job: BackfillJob) -> int:
    """The MV's watermark; an error when the MV was never snapshotted."""
    watermark = read_watermark(job.target, job.app_id)
    if watermark is None:
        raise TargetError(
            f"the MV {job.target} does not exist yet: run the snapshot phase first "
            "(spark_jobs/snapshot.py, or the DAG's snapshot task)."
        )
    return watermark
