"""Consistent reads across MVs, on hand-built Delta tables (no Spark): which version of each
table reflects which upstream epochs, through joins, MV-on-MV chains and Kafka MVs, and
what each policy chooses or refuses.

Each MV commit here writes one row naming the epochs it was committed at, so a test reads
back the chosen version and sees what it holds, not only what the answer claims."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from consistency_tables import foreign_write, mv, mv_commit, rows_at, rows_unchanged, upstream
from deltalake import DeltaTable

from airflow_backfill.cli import main
from airflow_backfill.consistent_reads import consistent_versions, table_spec
from airflow_backfill.engine import job_state
from airflow_backfill.engine.consistency.answer import ConsistentVersions
from airflow_backfill.engine.consistency.epochs import at_least, resolve_epochs
from airflow_backfill.engine.consistency.readers import delta_tables, read_arrow
from airflow_backfill.engine.consistency.tables import (
    KIND_JOIN,
    KIND_MV,
    KIND_TABLE,
    TableSpec,
    spec_for_table,
)
from airflow_backfill.exceptions import (
    BackfillConfigError,
    ConsistencyError,
    NotYetConsistentError,
    TargetError,
)
from airflow_backfill.job import BackfillJob
from airflow_backfill.kafka.config import KafkaBackfillJob, KafkaTopic
from airflow_backfill.kafka.positions import WATERMARK_FIELD


def job(root: Path, name: str, source: str) -> BackfillJob:
    return BackfillJob(name=name, source=source, target=str(root / name), query="SELECT id FROM source",
                       primary_key=["id"])


def join_job(root: Path, name: str, sources: dict[str, str]) -> BackfillJob:
    return BackfillJob(name=name, target=str(root / name), query="SELECT 1 AS x FROM orders JOIN customers ON true",
                       sources={n: {"table": uri, "primary_key": ["id"]} for n, uri in sources.items()})


def labels(answer: ConsistentVersions, name: str) -> list[str]:
    table = answer.tables[name]
    return rows_at(table.uri, table.version)


@pytest.fixture
def orders(tmp_path: Path) -> str:
    return upstream(str(tmp_path / "orders"), 10)  # versions 0..9


# ---- one upstream -----------------------------------------------------------------------


def test_mvs_over_one_upstream_meet_at_the_newest_epoch_all_committed(tmp_path, orders):
    a, b = job(tmp_path, "a", orders), job(tmp_path, "b", orders)
    mv(a.target, "a", orders, [2, 4, 5, 8])
    mv(b.target, "b", orders, [3, 4, 6, 7])
    answer = consistent_versions([a, b, orders])
    assert answer.policy == "common" and answer.agree and answer.epochs == {orders: 4}
    assert (answer.version("a"), answer.version("b"), answer.version("orders")) == (1, 1, 4)
    assert labels(answer, "a") == labels(answer, "b") == ["4"]
    assert answer.tables["orders"].kind == KIND_TABLE and answer.left_out == []
    assert ConsistentVersions.from_dict(json.loads(json.dumps(answer.to_dict()))) == answer


def test_latest_reads_each_newest_version_and_says_they_disagree(tmp_path, orders):
    a, b = job(tmp_path, "a", orders), job(tmp_path, "b", orders)
    mv(a.target, "a", orders, [2, 5])
    mv(b.target, "b", orders, [2, 7])
    answer = consistent_versions([a, b], policy="latest")
    assert (labels(answer, "a"), labels(answer, "b")) == (["5"], ["7"])
    assert not answer.agree and answer.epochs == {}
    mv_commit(a.target, "a", orders, 7)
    assert consistent_versions([a, b], policy="latest").epochs == {orders: 7}


def test_at_reads_the_versions_of_that_epoch_or_refuses_naming_the_mv(tmp_path, orders):
    a, b = job(tmp_path, "a", orders), job(tmp_path, "b", orders)
    mv(a.target, "a", orders, [2, 4, 5, 8])
    mv(b.target, "b", orders, [3, 4, 6, 7])
    answer = consistent_versions([a, b, orders], policy="at", at=4)
    assert labels(answer, "a") == labels(answer, "b") == ["4"] and answer.version("orders") == 4
    assert consistent_versions([a, b], policy="at", at="orders=4") == consistent_versions([a, b], policy="at", at=4)
    with pytest.raises(NotYetConsistentError, match=r"b has not reached epoch orders@8: its newest version 3 "
                                                    r"reflects orders@7"):
        consistent_versions([a, b], policy="at", at=8)
    with pytest.raises(ConsistencyError, match=r"a never committed epoch orders@6: version 2 reflects orders@5 "
                                               r"and version 3 orders@8") as refused:
        consistent_versions([a, b], policy="at", at=6)
    assert not isinstance(refused.value, NotYetConsistentError)  # waiting cannot help
    with pytest.raises(ConsistencyError, match=r"b has no version at epoch orders@2: its oldest version with an "
                                               r"epoch, 0, reflects orders@3 \(it was created later\)"):
        consistent_versions([a, b], policy="at", at=2)
    with pytest.raises(NotYetConsistentError, match="orders has not reached version 12"):
        consistent_versions([orders], policy="at", at=12)


def test_a_commit_that_changes_no_rows_keeps_its_epoch_and_a_foreign_write_has_none(tmp_path, orders):
    a, b = job(tmp_path, "a", orders), job(tmp_path, "b", orders)
    mv(a.target, "a", orders, [3, 5])
    mv(b.target, "b", orders, [3, 5])
    unchanged = rows_unchanged(a.target)
    answer = consistent_versions([a, b])
    assert answer.version("a") == unchanged and labels(answer, "a") == ["5"]  # the newest version of epoch 5
    foreign_write(b.target)  # rows changed without the job's app transaction: nobody's consistent state
    answer = consistent_versions([a, b])
    assert answer.version("b") == 1 and labels(answer, "b") == ["5"]


def test_mvs_that_share_no_epoch_are_told_to_wait(tmp_path, orders):
    a, b = job(tmp_path, "a", orders), job(tmp_path, "b", orders)
    mv(a.target, "a", orders, [2, 4, 6])
    mv(b.target, "b", orders, [3, 5, 7])
    with pytest.raises(NotYetConsistentError, match=r"share no upstream epoch in their last 1000 versions \(newest: "
                                                    r"a at orders@6; b at orders@7\)"):
        consistent_versions([a, b])
    mv_commit(a.target, "a", orders, 7)  # the upstream paused at 7: both caught up to it
    assert consistent_versions([a, b]).epochs == {orders: 7}


def test_the_search_goes_deeper_than_the_newest_versions(tmp_path):
    """Two MVs last shared an epoch 60 versions back: the newest 50 versions searched first
    hold none, a deeper search finds it; a history shorter than that gives up."""
    orders = upstream(str(tmp_path / "orders"), 64)
    a, b = job(tmp_path, "a", orders), job(tmp_path, "b", orders)
    mv(a.target, "a", orders, [1, 63])
    mv(b.target, "b", orders, [1, *range(3, 63)])
    answer = consistent_versions([a, b])
    assert answer.epochs == {orders: 1} and (answer.version("a"), answer.version("b")) == (0, 0)
    with pytest.raises(NotYetConsistentError, match="last 40 versions"):
        consistent_versions([a, b], history=40)


# ---- joins and chains -------------------------------------------------------------------


def test_a_join_meets_the_mvs_over_each_of_its_upstreams_through_its_vector(tmp_path, orders):
    customers = upstream(str(tmp_path / "customers"), 6)
    joined = join_job(tmp_path, "joined", {"orders": orders, "customers": customers})
    for vector in ({"orders": 3, "customers": 2}, {"orders": 5, "customers": 2}, {"orders": 7, "customers": 4}):
        mv_commit(joined.target, "joined", {"orders": orders, "customers": customers}, vector=vector)
    a, c = job(tmp_path, "a", orders), job(tmp_path, "c", customers)
    mv(a.target, "a", orders, [3, 5, 6, 8])
    mv(c.target, "c", customers, [2, 3, 4])
    answer = consistent_versions([joined, a, c])
    assert answer.epochs == {orders: 5, customers: 2}
    assert labels(answer, "joined") == ['{"customers": 2, "orders": 5}'] and labels(answer, "a") == ["5"]
    assert labels(answer, "c") == ["2"] and answer.tables["joined"].kind == KIND_JOIN
    at = consistent_versions([joined, a, c], policy="at", at={"orders": 3, customers: 2})
    assert labels(at, "a") == ["3"] and labels(at, "joined") == ['{"customers": 2, "orders": 3}']
    with pytest.raises(BackfillConfigError, match=r"read 2 upstream tables \(customers, orders\): give a version "
                                                  r"for each, e.g. customers=3,orders=3"):
        consistent_versions([joined], policy="at", at=3)
    with pytest.raises(BackfillConfigError, match="missing: customers"):
        consistent_versions([joined], policy="at", at="orders=3")


def test_a_table_still_in_its_snapshot_beside_a_join_is_named_as_what_holds_the_answer(tmp_path, orders):
    customers = upstream(str(tmp_path / "customers"), 6)
    joined = join_job(tmp_path, "joined", {"orders": orders, "customers": customers})
    for vector in ({"orders": 6, "customers": 2}, {"orders": 8, "customers": 4}):
        mv_commit(joined.target, "joined", {"orders": orders, "customers": customers}, vector=vector)
    new = job(tmp_path, "new", orders)
    mv(new.target, "new", orders, [3])  # its snapshot pinned epoch 3, before every commit of the join
    job_state.update_state(new.target, phase="snapshot", state=job_state.STATE_CREATING)
    with pytest.raises(NotYetConsistentError) as waiting:
        consistent_versions([joined, new])
    assert "new (phase snapshot) is still being created" in str(waiting.value)
    assert "pauses long enough" not in str(waiting.value)
    job_state.update_state(new.target, phase=job_state.PHASE_FORWARD, state=job_state.STATE_CREATED)
    with pytest.raises(NotYetConsistentError, match="pauses long enough"):  # created: the writers' pace is why
        consistent_versions([joined, new])


def test_a_join_whose_vector_does_not_match_its_watermark_is_refused(tmp_path, orders):
    customers = upstream(str(tmp_path / "customers"), 3)
    joined = join_job(tmp_path, "joined", {"orders": orders, "customers": customers})
    mv_commit(joined.target, "other_job", {"orders": orders, "customers": customers}, vector={"orders": 1,
                                                                                             "customers": 1})
    mv_commit(joined.target, "joined", {"orders": orders, "customers": customers}, watermark=4)  # no vector
    with pytest.raises(TargetError, match=r"records upstream versions None .* do not match its watermark 4"):
        consistent_versions([joined])


@pytest.mark.parametrize("name_the_first", [True, False])
def test_an_mv_over_an_mv_reflects_the_epoch_its_upstream_version_reflects(tmp_path, orders, name_the_first):
    """`second` records versions of `first`; `first`'s versions record epochs of orders.
    Named or not, `first` maps `second` down to orders (unnamed: recognised from its log)."""
    first, other = job(tmp_path, "first", orders), job(tmp_path, "other", orders)
    mv(first.target, "first", orders, [2, 4, 6])  # versions 0, 1, 2
    unchanged = rows_unchanged(first.target)  # version 3 still reflects epoch 6
    second = job(tmp_path, "second", first.target)
    mv(second.target, "second", first.target, [0, 1, unchanged])
    mv(other.target, "other", orders, [2, 4, 6, 7])
    named = [first, second, other] if name_the_first else [second, other]
    answer = consistent_versions(named)
    assert answer.epochs == {orders: 6}
    assert labels(answer, "second") == [str(unchanged)] and labels(answer, "other") == ["6"]
    assert (answer.version("second"), answer.version("other")) == (2, 2)
    assert answer.tables["second"].epochs == {orders: 6}
    if name_the_first:
        assert answer.version("first") == unchanged
    assert consistent_versions(named, policy="at", at=4).version("second") == 1
    with pytest.raises(ConsistencyError, match=f"{named[0].name} never committed epoch orders@5"):
        consistent_versions(named, policy="at", at=5)
    with pytest.raises(NotYetConsistentError, match=f"{named[0].name} has not reached epoch orders@7"):
        consistent_versions(named, policy="at", at=7)


def test_an_unnamed_upstream_is_recognised_from_its_log(tmp_path, orders):
    first = job(tmp_path, "first", orders)
    mv(first.target, "first", orders, [2])
    assert spec_for_table(first.target) == TableSpec("first", first.target, KIND_MV, "airflow_backfill/first",
                                                     {"source": orders})
    assert spec_for_table(orders) == TableSpec("orders", orders, KIND_TABLE)
    with pytest.raises(TargetError, match="is not a Delta table"):
        spec_for_table(str(tmp_path / "missing"))


# ---- MVs being created --------------------------------------------------------------------


def test_an_mv_being_created_holds_nobody_back_unless_named(tmp_path, orders):
    a, b, new = job(tmp_path, "a", orders), job(tmp_path, "b", orders), job(tmp_path, "new", orders)
    mv(a.target, "a", orders, [3, 8])
    mv(b.target, "b", orders, [3, 8])
    mv(new.target, "new", orders, [3])  # catching up from its snapshot at 3
    job_state.update_state(new.target, phase=job_state.PHASE_CATCH_UP, state=job_state.STATE_CREATING)
    answer = consistent_versions([a, b], also=[new])
    assert answer.epochs == {orders: 8} and list(answer.tables) == ["a", "b"]
    assert [(t.name, t.reason) for t in answer.left_out] == [
        ("new", "being created (phase catch_up); name it to read it anyway")]
    assert "new  left out: being created (phase catch_up)" in "\n".join(answer.lines())
    named = consistent_versions([a, b, new])
    assert named.epochs == {orders: 3} and named.left_out == []  # named: waited for
    job_state.update_state(new.target, phase=job_state.PHASE_FORWARD, state=job_state.STATE_CREATED)
    assert consistent_versions([a, b], also=[new]).epochs == {orders: 3}  # created: one of the set


def test_an_mv_without_a_committed_version_is_waited_for_when_named(tmp_path, orders):
    a, new = job(tmp_path, "a", orders), job(tmp_path, "new", orders)
    mv(a.target, "a", orders, [3])
    with pytest.raises(NotYetConsistentError, match="new: its MV does not exist yet"):
        consistent_versions([a, new])  # the job has not run yet (or its target is wrong: the message says)
    assert consistent_versions([a], also=[new]).left_out[0].reason.startswith("not created yet")
    foreign_write(new.target)  # e.g. snapshot chunks: rows without a watermark
    job_state.update_state(new.target, phase="snapshot", state=job_state.STATE_CREATING)
    with pytest.raises(NotYetConsistentError, match="new: none of the latest 1000 versions .* reflects an upstream"):
        consistent_versions([a, new])
    answer = consistent_versions([a], also=[new])
    assert answer.left_out[0].name == "new" and answer.epochs == {orders: 3}
    with pytest.raises(NotYetConsistentError, match="every table is being created"):
        consistent_versions([], also=[new])


# ---- Kafka MVs ----------------------------------------------------------------------------


def kafka_job(root: Path, source_table: str) -> KafkaBackfillJob:
    topic = KafkaTopic(bootstrap_servers="127.0.0.1:9092", topic="orders", value_schema="id BIGINT")
    return KafkaBackfillJob(name="kafka_mv", upstream=topic, source_table=source_table, target=str(root / "kafka_mv"),
                            query="SELECT id FROM source")


def test_a_kafka_mv_reflects_its_source_tables_version_once_every_split_is_finished(tmp_path):
    source_table = upstream(str(tmp_path / "kafka_orders"), 7)  # the source job's table (the base upstream)
    kafka = kafka_job(tmp_path, source_table)
    assert table_spec(kafka).epoch_field == WATERMARK_FIELD
    mv_commit(kafka.target, "kafka_mv", source_table, kafka_round=1, recorded=None)  # splits still Backfilling
    over_source = job(tmp_path, "over_source", source_table)
    mv(over_source.target, "over_source", source_table, [3, 5, 6])
    answer = consistent_versions([over_source], also=[kafka])
    assert answer.left_out[0].name == "kafka_mv" and "being created" in answer.left_out[0].reason
    for kafka_round, recorded in ((2, 3), (3, 5), (4, 6)):
        mv_commit(kafka.target, "kafka_mv", source_table, kafka_round=kafka_round, recorded=recorded)
    answer = consistent_versions([kafka, over_source], policy="at", at=5)
    assert labels(answer, "kafka_mv") == ["kafka 5"] and labels(answer, "over_source") == ["5"]
    assert consistent_versions([kafka, over_source]).epochs == {source_table: 6}
    downstream = job(tmp_path, "downstream", kafka.target)
    mv(downstream.target, "downstream", kafka.target, [2])
    with pytest.raises(BackfillConfigError, match="a Kafka MV.*name its job file too"):
        consistent_versions([downstream])  # its upstream's log does not name the source table
    assert consistent_versions([downstream, kafka]).tables["downstream"].epochs == {source_table: 5}


# ---- versions that are gone ---------------------------------------------------------------


def test_at_a_vacuumed_version_is_refused_and_nothing_is_read(tmp_path, orders):
    a, b = job(tmp_path, "a", orders), job(tmp_path, "b", orders)
    mv(a.target, "a", orders, [2, 4, 6])
    mv(b.target, "b", orders, [2, 4, 6])
    assert labels(consistent_versions([a, b], policy="at", at=4), "a") == ["4"]
    DeltaTable(a.target).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    with pytest.raises(ConsistencyError, match=r"a: version 1 of .* was vacuumed: 1 of its data files are gone"):
        consistent_versions([a, b], policy="at", at=4)
    assert consistent_versions([a, b]).epochs == {orders: 6}  # the latest versions are whole


def test_at_an_epoch_whose_log_entries_were_cleaned_up_is_refused(tmp_path, orders):
    """Versions 0 and 1 lost their log entries (log retention): version 2's entry is still
    there, but nothing before it to rebuild the table from; version 3 has a checkpoint."""
    a = job(tmp_path, "a", orders)
    mv(a.target, "a", orders, [2, 4, 6, 8])
    DeltaTable(a.target).create_checkpoint()
    for version in (0, 1):
        os.remove(Path(a.target) / "_delta_log" / f"{version:020d}.json")
    assert labels(consistent_versions([a], policy="at", at=8), "a") == ["8"]
    with pytest.raises(ConsistencyError, match=r"a: version 2 of .* can no longer be read .*log entries were "
                                               r"cleaned up"):
        consistent_versions([a], policy="at", at=6)
    with pytest.raises(ConsistencyError, match=r"a: no version of .* still in its log reflects epoch orders@4"):
        consistent_versions([a], policy="at", at=4)


# ---- inputs -------------------------------------------------------------------------------


def test_epochs_are_given_by_table_name_or_uri_and_checked_first():
    bases = {"/lake/orders", "/lake/customers"}
    assert resolve_epochs("orders=12,customers=3", bases, every_base=True) == {"/lake/orders": 12,
                                                                                "/lake/customers": 3}
    assert resolve_epochs({"/lake/orders": 12}, bases, every_base=False) == {"/lake/orders": 12}
    assert resolve_epochs("7", {"/lake/orders"}, every_base=True) == {"/lake/orders": 7}
    rendered = str({"/lake/orders": 12})  # a mapping rendered by a template, e.g. an asset event's upstream_epochs
    assert resolve_epochs(rendered, bases, every_base=False) == {"/lake/orders": 12}
    for value, message in (("orders=-1", "must be a Delta version"), ("orders=x", "must be a Delta version"),
                           ("nation=1", "'nation' is not an upstream table"), ("=3", "must read TABLE=VERSION"),
                           (True, "must be a Delta version"), ("{'orders': 1", "is not a mapping"),
                           ("{'orders'}", "is not a mapping")):
        with pytest.raises(BackfillConfigError, match=message):
            resolve_epochs(value, bases, every_base=False)
    assert at_least({"/lake/orders": 12, "/lake/customers": 3}, {"/lake/orders": 12})
    assert not at_least({"/lake/orders": 11}, {"/lake/orders": 12})


def test_bad_requests_are_refused_before_any_table_is_read(tmp_path, orders):
    a = job(tmp_path, "a", orders)
    for kwargs, message in (({"policy": "newest"}, "policy must be one of common, latest, at"),
                            ({"policy": "at"}, "give the epochs with policy `at`"),
                            ({"at": 3}, "give the epochs with policy `at`")):
        with pytest.raises(BackfillConfigError, match=message):
            consistent_versions([a], **kwargs)
    with pytest.raises(BackfillConfigError, match="a and a are the same name"):
        consistent_versions([a, a])
    with pytest.raises(BackfillConfigError, match="a table to read must be a job"):
        consistent_versions([3])  # type: ignore[list-item]


# ---- readers and the command line ---------------------------------------------------------


def test_the_readers_open_exactly_the_chosen_versions(tmp_path, orders):
    a, b = job(tmp_path, "a", orders), job(tmp_path, "b", orders)
    mv(a.target, "a", orders, [2, 4, 5])
    mv(b.target, "b", orders, [4, 6])
    plain = consistent_versions([a, b, orders]).to_dict()  # as a sensor pushes it to XCom
    assert read_arrow(plain, "a").column("epochs").to_pylist() == ["4"]
    assert read_arrow(plain, "orders", "SELECT count(*) AS n FROM t").column("n").to_pylist() == [5]
    tables = delta_tables(plain)
    assert {name: table.version() for name, table in tables.items()} == {"a": 1, "b": 0, "orders": 4}


def test_the_command_prints_each_tables_version_and_epochs(tmp_path, orders, capsys):
    files = []
    for name, watermarks in (("a", [2, 4, 5]), ("b", [4, 6])):
        mv(str(tmp_path / name), name, orders, watermarks)
        path = tmp_path / f"{name}.yaml"
        path.write_text(f"name: {name}\nsource: {orders}\ntarget: {tmp_path / name}\nquery: SELECT id FROM source\n"
                        "primary_key: [id]\n")
        files += ["--job", str(path)]
    assert main(["consistent", *files, "--table", orders]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "policy common: orders@4", "a       version 1      epochs orders@4", "b       version 0      epochs orders@4",
        "orders  version 4      epochs orders@4"]
    assert main(["consistent", *files, "--json", "--policy", "latest"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert (printed["agree"], printed["tables"]["b"]["version"], printed["tables"]["b"]["epochs"]) == (
        False, 1, {orders: 6})
    assert main(["consistent", *files, "--at", "6"]) == 1
    assert "a has not reached epoch orders@6" in capsys.readouterr().err
    assert main(["consistent", "--jobs-in", str(tmp_path), "--at", "orders=4"]) == 0
    assert "b  version 0      epochs orders@4" in capsys.readouterr().out
    assert main(["consistent", "--jobs-in", str(tmp_path), "--table", str(tmp_path / "b"), "--policy", "latest"]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == ["b  version 1      epochs orders@6",  # named: first
                                                        "a  version 2      epochs orders@5"]
    assert main(["consistent", *files, "--policy", "at"]) == 2
    assert main(["consistent"]) == 2
    assert "name the MVs to read" in capsys.readouterr().err
