"""Size thresholds (engine/sizes.py) changed for one test: `set_sizes(monkeypatch,
driver_rows=0)` moves a path to the other side of its threshold until the test ends."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_backfill.engine import sizes as sizes_module


def set_sizes(monkeypatch: pytest.MonkeyPatch, **values: Any) -> None:
    changed = sizes_module.with_values(sizes_module.sizes(), values, origin="set_sizes")
    monkeypatch.setattr(sizes_module, "_override", changed)
