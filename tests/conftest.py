"""Shared fixtures: one local SparkSession for the whole test session (JVM start-up
costs seconds), and per-test Delta table locations."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# py4j logs at interpreter exit, after pytest closed the captured streams.
logging.getLogger("py4j").setLevel(logging.WARNING)


@pytest.fixture(scope="session")
def spark():
    from airflow_backfill.engine.spark_session import build_spark_session

    session = build_spark_session("airflow_backfill-tests", parallelism=2)
    yield session
    session.stop()


@pytest.fixture
def tables(tmp_path: Path) -> dict[str, str]:
    """Paths for an upstream and its MV inside the test's temporary directory."""
    return {"source": str(tmp_path / "orders"), "target": str(tmp_path / "orders_mv")}
