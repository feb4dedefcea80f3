"""The TPC-H workload generator: initial load, RF1/RF2 refreshes and updates keep the
tables consistent (keys unique, every line item has its order) and feed the log store."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from airflow_backfill import tpch
from airflow_backfill.engine.delta.log import check_upstream
from airflow_backfill.exceptions import BackfillConfigError

SCALE_FACTOR = 0.002


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> tpch.TpchTables:
    return tpch.load_tpch(str(tmp_path_factory.mktemp("tpch")), SCALE_FACTOR, files=4)


@pytest.fixture
def tables(tmp_path: Path, loaded: tpch.TpchTables) -> tpch.TpchTables:
    """A private copy of the loaded tables, so each test starts from version 0."""
    import shutil

    root = tmp_path / "tpch"
    shutil.copytree(loaded.root, root)
    return tpch.open_tpch(str(root))


def _rows(uri: str, columns: list[str] | None = None) -> pa.Table:
    return DeltaTable(uri).to_pyarrow_table(columns=columns)


def _assert_consistent(tables: tpch.TpchTables) -> tuple[int, int]:
    """Keys unique in both tables and every line item belongs to an order; returns the counts."""
    orders = _rows(tables.orders, ["o_orderkey"])
    lines = _rows(tables.lineitem, ["l_orderkey", "l_linenumber"])
    assert pc.count_distinct(orders["o_orderkey"]).as_py() == orders.num_rows
    assert lines.group_by(["l_orderkey", "l_linenumber"]).aggregate([]).num_rows == lines.num_rows
    assert set(pc.unique(lines["l_orderkey"]).to_pylist()) == set(orders["o_orderkey"].to_pylist())
    return orders.num_rows, lines.num_rows


def _change_types(uri: str, version: int) -> dict[str, int]:
    feed = pa.table(DeltaTable(uri).load_cdf(starting_version=version, ending_version=version).read_all())
    return {row["values"]: row["counts"] for row in pc.value_counts(feed["_change_type"]).to_pylist()}


def test_load_creates_cdf_tables_with_tpch_row_counts(loaded: tpch.TpchTables) -> None:
    assert loaded.scale_factor == SCALE_FACTOR
    for table in tpch.TABLES:
        upstream = check_upstream(loaded.path(table))  # CDF on, unpartitioned, readable
        assert upstream.version == 0
        assert len(DeltaTable(loaded.path(table)).file_uris()) >= 2
        assert not pa.types.is_string_view(upstream.schema.field(1).type)
    orders, lines = _assert_consistent(loaded)
    assert orders == round(SCALE_FACTOR * tpch.ORDERS_PER_SF)
    assert orders <= lines <= 7 * orders
    assert tpch.open_tpch(loaded.root) == loaded


def test_rf1_inserts_new_orders_with_their_lineitems_in_one_commit_each(tables: tpch.TpchTables) -> None:
    orders_before, lines_before = _assert_consistent(tables)
    loaded_max = pc.max(_rows(tables.orders, ["o_orderkey"])["o_orderkey"]).as_py()
    count = tpch.refresh_count(tables)
    assert count == 3  # 0.1% of SF 0.002's 3000 orders

    result = tpch.insert_new_orders(tables, seed=7)

    assert (result.orders, result.orders_version, result.lineitem_version) == (count, 1, 1)
    assert result.order_keys == (loaded_max + 1, loaded_max + count)
    orders_after, lines_after = _assert_consistent(tables)
    assert orders_after == orders_before + count
    assert lines_after == lines_before + result.lineitems
    assert _change_types(tables.orders, 1) == {"insert": count}
    assert _change_types(tables.lineitem, 1) == {"insert": result.lineitems}
    new = _rows(tables.orders).filter(pc.field("o_orderkey") > loaded_max)
    assert set(new["o_orderstatus"].to_pylist()) <= {"O", "F", "P"}
    assert pc.min(new["o_totalprice"]).as_py() > 0


def test_rf2_deletes_old_orders_and_their_lineitems(tables: tpch.TpchTables) -> None:
    orders_before, lines_before = _assert_consistent(tables)
    loaded_max = pc.max(_rows(tables.orders, ["o_orderkey"])["o_orderkey"]).as_py()

    result = tpch.delete_old_orders(tables, seed=7, count=5)

    assert (result.orders, result.orders_version, result.lineitem_version) == (5, 1, 1)
    assert result.order_keys[1] <= loaded_max
    orders_after, lines_after = _assert_consistent(tables)
    assert (orders_after, lines_after) == (orders_before - 5, lines_before - result.lineitems)
    assert _change_types(tables.orders, 1) == {"delete": 5}
    assert _change_types(tables.lineitem, 1) == {"delete": result.lineitems}


def test_rf1_then_rf2_restore_the_counts_and_keys_are_never_reused(tables: tpch.TpchTables) -> None:
    orders_before, lines_before = _assert_consistent(tables)
    inserted = tpch.insert_new_orders(tables, seed=1, count=4)
    deleted = tpch.delete_old_orders(tables, seed=1, count=4)
    again = tpch.insert_new_orders(tables, seed=1, count=4)
    orders_after, lines_after = _assert_consistent(tables)
    assert orders_after == orders_before + 4
    assert lines_after == lines_before + inserted.lineitems - deleted.lineitems + again.lineitems
    assert again.order_keys[0] == inserted.order_keys[1] + 1


def test_refreshes_are_deterministic_for_a_seed(tmp_path: Path, loaded: tpch.TpchTables) -> None:
    import shutil

    results = []
    for name in ("a", "b"):
        shutil.copytree(loaded.root, tmp_path / name)
        tables = tpch.open_tpch(str(tmp_path / name))
        tpch.insert_new_orders(tables, seed=3)
        tpch.delete_old_orders(tables, seed=3)
        results.append(_rows(tables.lineitem).sort_by([("l_orderkey", "ascending"), ("l_linenumber", "ascending")]))
    assert results[0].equals(results[1])


def test_update_lineitems_changes_a_share_in_one_merge(tables: tpch.TpchTables) -> None:
    _, lines = _assert_consistent(tables)
    updated, version = tpch.update_lineitems(tables, seed=2, share=0.01)
    assert version == 1
    assert updated == round(lines * 0.01)
    assert _change_types(tables.lineitem, 1) == {"update_preimage": updated, "update_postimage": updated}
    assert _assert_consistent(tables)[1] == lines
    images = pa.table(DeltaTable(tables.lineitem).load_cdf(starting_version=1, ending_version=1).read_all()).to_pylist()
    discounts: dict[tuple, dict[str, object]] = {}
    for image in images:
        discounts.setdefault((image["l_orderkey"], image["l_linenumber"]), {})[image["_change_type"]] = \
            image["l_discount"]
    assert len(discounts) == updated
    assert all(d["update_preimage"] != d["update_postimage"] for d in discounts.values())  # each row changed


def test_update_of_the_newest_line_items_takes_the_largest_order_keys(tables: tpch.TpchTables) -> None:
    _, lines = _assert_consistent(tables)
    keys = _rows(tables.lineitem).column("l_orderkey").to_pylist()
    updated, version = tpch.update_lineitems(tables, seed=2, share=0.05, newest=True)
    changed = DeltaTable(tables.lineitem).load_cdf(starting_version=version, ending_version=version).read_all()
    changed_keys = changed.column("l_orderkey").to_pylist()
    assert updated == round(lines * 0.05) == len(changed_keys) // 2
    assert min(changed_keys) >= sorted(keys)[-updated]


def test_bad_arguments_are_refused(tmp_path: Path, tables: tpch.TpchTables) -> None:
    with pytest.raises(BackfillConfigError, match="scale factor"):
        tpch.load_tpch(str(tmp_path / "x"), 0)
    with pytest.raises(BackfillConfigError, match="count"):
        tpch.insert_new_orders(tables, seed=1, count=0)
    with pytest.raises(BackfillConfigError, match="share"):
        tpch.update_lineitems(tables, seed=1, share=1.5)


def test_command_line_loads_and_refreshes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = str(tmp_path / "cli")
    assert tpch.main(["load", "--root", root, "--scale-factor", "0.001", "--files", "2"]) == 0
    assert tpch.main(["rf1", "--root", root, "--seed", "1", "--repeat", "2"]) == 0
    assert tpch.main(["rf2", "--root", root, "--count", "2"]) == 0
    assert tpch.main(["update", "--root", root, "--share", "0.05"]) == 0
    assert DeltaTable(tpch.open_tpch(root).lineitem).version() == 4
    assert '"kind": "RF2"' in capsys.readouterr().out
    assert tpch.main(["load", "--root", root]) == 2


def test_customer_loads_for_joins_with_a_key_for_every_order(tmp_path: Path, loaded: tpch.TpchTables) -> None:
    from airflow_backfill.tpch import main

    root = tmp_path / "tpch"
    assert main(["load", "--root", str(root), "--scale-factor", str(SCALE_FACTOR), "--tables", "customer"]) == 0
    customers = tpch.TpchTables(str(root), SCALE_FACTOR).customer
    assert check_upstream(customers).version == 0
    keys = _rows(customers, list(tpch.PRIMARY_KEYS[tpch.CUSTOMER]))["c_custkey"]
    assert pc.count_distinct(keys).as_py() == len(keys) == round(SCALE_FACTOR * 150_000)
    assert set(_rows(loaded.orders, ["o_custkey"])["o_custkey"].to_pylist()) <= set(keys.to_pylist())
    with pytest.raises(BackfillConfigError, match="unknown TPC-H table"):
        tpch.load_tpch(str(tmp_path / "y"), SCALE_FACTOR, tables=["nation"])
