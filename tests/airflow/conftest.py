"""Fixtures for the Airflow layer: small upstreams and hand-built MVs (no Spark), and a
stand-in for the task instance that records XCom pushes."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from airflow_backfill.job import BackfillJob


class RecordingTaskInstance:
    """Collects xcom_push calls the way the operators make them."""

    def __init__(self) -> None:
        self.pushed: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value


def context_with(conf: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"ti": RecordingTaskInstance(), "dag_run": SimpleNamespace(conf=conf or {})}


def commit_upstream_versions(uri: str, versions: int) -> None:
    """An upstream with the Change Data Feed at version `versions - 1`."""
    for version in range(versions):
        batch = pa.table({"order_id": pa.array([version], pa.int64()), "amount": pa.array([float(version)])})
        write_deltalake(uri, batch, mode="append", configuration={"delta.enableChangeDataFeed": "true"})


@pytest.fixture
def job(tables: dict[str, str]) -> BackfillJob:
    return BackfillJob(
        name="orders_mv", query="SELECT order_id, amount FROM source", primary_key=["order_id"],
        lag_threshold=1, poll_interval=0.05, **tables,
    )
