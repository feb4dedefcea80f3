"""The session's API server (see airflow_server.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from airflow_server import ApiServer, run_api_server


@pytest.fixture(scope="session")
def api_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    yield from run_api_server(tmp_path_factory)
