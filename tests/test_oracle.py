"""The oracle must be able to fail: hand-built MVs with a wrong, missing or duplicated row,
a wrong watermark or a watermark that goes back are all reported, readably."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
import yaml
from deltalake import write_deltalake
from helpers_delta import write_mv_version

from oracle import (
    assert_every_commit_matches,
    assert_mv_matches,
    assert_rows_match,
    expected_rows,
    main,
    mv_rows,
    mv_watermark,
)

APP_ID = "airflow_backfill/oracle_test"
QUERY = "SELECT order_id AS id, upper(status) AS status, amount * quantity AS total, updated_at " \
        "FROM source WHERE status <> 'cancelled'"
UTC = dt.UTC


def orders_batch(ids: list[int], statuses: list[str], amounts: list[float | None]) -> pa.Table:
    return pa.table({
        "order_id": pa.array(ids, pa.int64()),
        "status": pa.array(statuses, pa.string()),
        "amount": pa.array(amounts, pa.float64()),
        "quantity": pa.array([2] * len(ids), pa.int32()),
        "updated_at": pa.array([dt.datetime(2024, 1, 1, order_id, tzinfo=UTC) for order_id in ids],
                               pa.timestamp("us", tz="UTC")),
    })


@pytest.fixture
def upstream(tmp_path: Path) -> str:
    """Version 0: orders 1..4 (order 3 cancelled); version 1: order 5 added."""
    uri = str(tmp_path / "orders")
    write_deltalake(uri, orders_batch([1, 2, 3, 4], ["new", "paid", "cancelled", "shipped"],
                                      [10.0, 0.1, 5.0, None]))
    write_deltalake(uri, orders_batch([5], ["new"], [7.5]), mode="append")
    return uri


def mv_for(upstream_rows: pa.Table) -> pa.Table:
    """The query computed by hand with pyarrow (independently of DuckDB)."""
    kept = upstream_rows.filter(pc.not_equal(upstream_rows.column("status"), "cancelled"))
    return pa.table({
        "id": kept.column("order_id"),
        "status": pc.utf8_upper(kept.column("status")),
        "total": pc.multiply(kept.column("amount"), pc.cast(kept.column("quantity"), pa.float64())),
        "updated_at": kept.column("updated_at"),
    })


def good_mv(version: int) -> pa.Table:
    ids = [1, 2, 3, 4] + ([5] if version >= 1 else [])
    statuses = ["new", "paid", "cancelled", "shipped"] + (["new"] if version >= 1 else [])
    amounts = [10.0, 0.1, 5.0, None] + ([7.5] if version >= 1 else [])
    return mv_for(orders_batch(ids, statuses, amounts))


def replace_row(table: pa.Table, index: int, **values) -> pa.Table:
    rows = table.to_pylist()
    rows[index] = {**rows[index], **values}
    return pa.Table.from_pylist(rows, schema=table.schema)


def test_expected_rows_runs_the_spark_sql_on_the_upstream_version(upstream):
    at_0 = expected_rows(upstream, 0, QUERY)
    at_1 = expected_rows(upstream, 1, QUERY)
    assert sorted(at_0.column("id").to_pylist()) == [1, 2, 4]
    assert sorted(at_1.column("id").to_pylist()) == [1, 2, 4, 5]
    assert set(at_1.column("status").to_pylist()) == {"NEW", "PAID", "SHIPPED"}


def test_a_correct_mv_passes(upstream, tmp_path):
    target = str(tmp_path / "mv")
    write_mv_version(target, good_mv(1), APP_ID, watermark=1)
    assert mv_watermark(target, APP_ID) == 1
    assert mv_rows(target).num_rows == 4
    assert assert_mv_matches(upstream, target, QUERY, APP_ID, key=["id"]) == 1


def test_a_missing_row_is_reported(upstream, tmp_path):
    target = str(tmp_path / "mv")
    write_mv_version(target, good_mv(1).slice(0, 3), APP_ID, watermark=1)
    with pytest.raises(AssertionError) as failure:
        assert_mv_matches(upstream, target, QUERY, APP_ID, key=["id"])
    message = str(failure.value)
    assert "at version latest (watermark 1) does not match" in message
    assert "the query gives 4 rows, the MV has 3" in message
    assert "1 row(s) missing from the MV:" in message and "'id': 5" in message
    assert "in the MV that the query does not give" not in message


def test_a_wrong_value_is_reported_as_missing_and_extra(upstream, tmp_path):
    target = str(tmp_path / "mv")
    write_mv_version(target, replace_row(good_mv(1), 0, total=21.0), APP_ID, watermark=1)
    with pytest.raises(AssertionError) as failure:
        assert_mv_matches(upstream, target, QUERY, APP_ID, key=["id"])
    message = str(failure.value)
    assert "1 row(s) missing from the MV:" in message and "'total': 20.0" in message
    assert "1 row(s) in the MV that the query does not give:" in message and "'total': 21.0" in message


def test_a_duplicated_row_is_reported_with_and_without_a_key(upstream, tmp_path):
    target = str(tmp_path / "mv")
    mv = good_mv(1)
    write_mv_version(target, pa.concat_tables([mv, mv.slice(1, 1)]), APP_ID, watermark=1)
    with pytest.raises(AssertionError, match=r"1 MV key value\(s\) appear more than once") as failure:
        assert_mv_matches(upstream, target, QUERY, APP_ID, key=["id"])
    assert "{'id': 2} x2" in str(failure.value)
    with pytest.raises(AssertionError, match=r"1 row\(s\) in the MV that the query does not give"):
        assert_mv_matches(upstream, target, QUERY, APP_ID)


def test_the_wrong_watermark_is_reported(upstream, tmp_path):
    target = str(tmp_path / "mv")
    write_mv_version(target, good_mv(0), APP_ID, watermark=1)
    with pytest.raises(AssertionError, match="missing from the MV"):
        assert_mv_matches(upstream, target, QUERY, APP_ID)


def test_a_mv_without_the_watermark_is_reported(upstream, tmp_path):
    target = str(tmp_path / "mv")
    write_deltalake(target, good_mv(1))
    with pytest.raises(AssertionError, match="has no watermark for app id"):
        assert_mv_matches(upstream, target, QUERY, APP_ID)


def test_different_columns_are_reported(upstream, tmp_path):
    target = str(tmp_path / "mv")
    write_mv_version(target, good_mv(1).rename_columns(["order_id", "status", "total", "updated_at"]),
                     APP_ID, watermark=1)
    with pytest.raises(AssertionError, match=r"columns differ: .*missing \['id'\], unexpected \['order_id'\]"):
        assert_mv_matches(upstream, target, QUERY, APP_ID)


def test_float_noise_column_order_and_time_zones_are_tolerated():
    expected = pa.table({
        "k": pa.array([1, 2], pa.int64()),
        "x": pa.array([0.3, None], pa.float64()),
        "t": pa.array([dt.datetime(2024, 1, 1, 12, tzinfo=UTC)] * 2, pa.timestamp("us", tz="UTC")),
    })
    plus_two = dt.timezone(dt.timedelta(hours=2))
    actual = pa.table({
        "t": pa.array([dt.datetime(2024, 1, 1, 14, tzinfo=plus_two)] * 2, pa.timestamp("us", tz="+02:00")),
        "x": pa.array([None, 0.1 + 0.2], pa.float64()),
        "k": pa.array([2, 1], pa.int32()),
    })
    assert_rows_match(expected, actual, key=["k"])
    off = actual.set_column(1, "x", pa.array([None, 0.31], pa.float64()))
    with pytest.raises(AssertionError, match="missing from the MV"):
        assert_rows_match(expected, off)


def test_every_commit_is_checked_at_its_own_watermark(upstream, tmp_path):
    target = str(tmp_path / "mv")
    write_mv_version(target, good_mv(0), APP_ID, watermark=0)
    write_mv_version(target, good_mv(1), APP_ID, watermark=1)
    assert assert_every_commit_matches(upstream, target, QUERY, APP_ID, key=["id"]) == 2

    write_mv_version(target, good_mv(1).slice(1), APP_ID, watermark=1)
    with pytest.raises(AssertionError, match=r"at version 2 \(watermark 1\) does not match"):
        assert_every_commit_matches(upstream, target, QUERY, APP_ID, key=["id"])


def test_a_watermark_moving_back_is_reported(upstream, tmp_path):
    target = str(tmp_path / "mv")
    write_mv_version(target, good_mv(1), APP_ID, watermark=1)
    write_mv_version(target, good_mv(0), APP_ID, watermark=0)
    with pytest.raises(AssertionError, match="watermark moved backwards from 1 to 0 at MV version 1"):
        assert_every_commit_matches(upstream, target, QUERY, APP_ID)


def test_command_line_checks_a_job_file(upstream, tmp_path, capsys):
    target = str(tmp_path / "mv")
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"name": "oracle_test", "source": upstream, "target": target,
                                   "query": QUERY, "primary_key": ["order_id"]}))
    write_mv_version(target, good_mv(1), APP_ID, watermark=1)
    assert main(["--job", str(job)]) == 0
    assert "matches the query on the upstream at epoch 1" in capsys.readouterr().out
    write_mv_version(target, good_mv(0), APP_ID, watermark=1)
    assert main(["--job", str(job), "--every-commit"]) == 1
    assert "MISMATCH" in capsys.readouterr().err


def test_oracle_imports_nothing_from_the_package():
    code = "import sys, oracle; print(sorted(m for m in sys.modules if m.startswith('airflow_backfill')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
