"""The catch-up driver's JIT choice: the quick compiler for a small pending change only,
estimated from the upstream's log without Spark."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from size_overrides import set_sizes

from airflow_backfill.engine.launch.jit import (
    QUICK_JIT_OPTION,
    PendingChange,
    check_mode,
    pending_change,
    quick_jit_suits,
    sets_own_jit,
    with_quick_jit,
)
from airflow_backfill.exceptions import BackfillConfigError

BASE_ROWS = 200_000


def append_orders(uri: str, first: int, count: int) -> None:
    batch = pa.table({"order_id": pa.array(range(first, first + count), pa.int64()),
                      "amount": pa.array([float(i % 977) for i in range(first, first + count)])})
    write_deltalake(uri, batch, mode="append", configuration={"delta.enableChangeDataFeed": "true"})


@pytest.fixture(autouse=True)
def by_share_alone(monkeypatch):
    """Judge these small tables by the change's share, as a large upstream would be."""
    set_sizes(monkeypatch, small_upstream_rows=0)


@pytest.fixture
def upstream(tmp_path) -> str:
    """Version 0: BASE_ROWS rows."""
    uri = str(tmp_path / "orders")
    append_orders(uri, 0, BASE_ROWS)
    return uri


def test_a_few_new_rows_are_a_small_change(upstream):
    append_orders(upstream, BASE_ROWS, 200)
    change = pending_change({"source": upstream}, {"source": 0})
    assert change is not None and change.change_rows is not None
    assert 0 < change.change_rows < BASE_ROWS // 100
    assert change.upstream_rows == BASE_ROWS + 200
    assert quick_jit_suits(change)
    assert "change rows" in change.describe()


def test_a_tenth_of_the_table_is_a_large_change(upstream):
    append_orders(upstream, BASE_ROWS, BASE_ROWS // 10)
    change = pending_change({"source": upstream}, {"source": 0})
    assert change is not None and not quick_jit_suits(change)


def test_any_change_of_a_small_upstream_is_small(upstream, monkeypatch):
    append_orders(upstream, BASE_ROWS, BASE_ROWS // 10)
    change = pending_change({"source": upstream}, {"source": 0})
    assert not quick_jit_suits(change)
    set_sizes(monkeypatch, small_upstream_rows=BASE_ROWS + BASE_ROWS // 10)
    assert quick_jit_suits(change)


def test_nothing_pending_is_a_small_change(upstream):
    change = pending_change({"source": upstream}, {"source": 0})
    assert change == PendingChange(0, BASE_ROWS) and quick_jit_suits(change)


def test_before_the_snapshot_or_past_many_epochs_the_change_is_not_known(upstream, monkeypatch):
    assert pending_change({"source": upstream}, None) is None
    assert not quick_jit_suits(None)
    set_sizes(monkeypatch, jit_epochs_read=1)
    append_orders(upstream, BASE_ROWS, 1)
    append_orders(upstream, BASE_ROWS + 1, 1)
    change = pending_change({"source": upstream}, {"source": 0})
    assert change is not None and change.change_rows is None and not quick_jit_suits(change)
    assert "more than 1 epochs" in change.describe()


def test_every_upstream_of_a_join_counts(upstream, tmp_path):
    other = str(tmp_path / "customers")
    append_orders(other, 0, 1000)
    append_orders(other, 1000, 1000)
    change = pending_change({"orders": upstream, "customers": other}, {"orders": 0, "customers": 0})
    assert change is not None and change.upstream_rows == BASE_ROWS + 2000
    assert change.change_rows is not None and change.change_rows >= 500


def test_modes_and_options():
    assert check_mode("quick") == "quick"
    with pytest.raises(BackfillConfigError, match="driver_jit 'fast' is not one of auto, quick, full"):
        check_mode("fast")
    assert with_quick_jit("-Xss4m ") == f"-Xss4m {QUICK_JIT_OPTION}"
    assert with_quick_jit(None) == QUICK_JIT_OPTION
    assert sets_own_jit("-Xss4m -XX:TieredStopAtLevel=4") and sets_own_jit(None, "-XX:-TieredCompilation")
    assert not sets_own_jit("-Xss4m", None) and not sets_own_jit(None)
