"""Every entry point of `engine/internals.py` called against the pinned PySpark and
delta-spark: a new version that moves or reshapes one of the private classes the engine
uses fails here, naming the call (`InternalsChanged`), before any user's commit does.
And no other module reaches below PySpark's public API."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from airflow_backfill.engine import internals
from airflow_backfill.engine.internals import DeltaTransaction, InternalsChanged

pytestmark = pytest.mark.spark

PACKAGE = Path(__file__).resolve().parents[1] / "airflow_backfill"
PRIVATE = re.compile(r"\._(jvm|jdf|jsparkSession|jsc|jconf|jreader|jwrite)\b")


def test_no_module_but_the_door_reaches_pysparks_private_attributes():
    reaching = [f"{path.relative_to(PACKAGE.parent)}:{number}" for path in PACKAGE.rglob("*.py")
                if path.name != "internals.py"
                for number, line in enumerate(path.read_text().splitlines(), 1) if PRIVATE.search(line)]
    assert reaching == []


def test_a_call_whose_shape_changed_is_named(spark):
    not_a_snapshot = spark._jvm.java.util.ArrayList()  # a JVM object without the method
    with pytest.raises(InternalsChanged, match="Snapshot.version: "):
        internals.snapshot_version(not_a_snapshot)


def test_plans_and_local_rows(spark):
    instants = pa.array([dt.datetime(1883, 11, 18, 17, tzinfo=dt.UTC), None], pa.timestamp("us", tz="UTC"))
    local = spark.createDataFrame(pa.table({"k": pa.array([1, 2], pa.int64()), "t": instants}))
    projected = local.selectExpr("k * 2 AS k2", "t")
    assert internals.plan_kind(internals.optimized_plan(projected)) == "LocalRelation"
    assert internals.leaf_kinds(internals.analyzed_plan(projected)) == ["LocalRelation"]
    assert internals.local_relation_rows(projected) == 2
    rows = internals.local_rows_as_arrow(projected)
    assert rows is not None and rows.column("k2").to_pylist() == [2, 4]
    assert rows.column("t").cast(pa.int64()).to_pylist() == instants.cast(pa.int64()).to_pylist()
    empty = internals.local_rows_as_arrow(projected.filter("k2 > 10"))
    assert empty is not None and empty.num_rows == 0 and empty.schema.names == ["k2", "t"]
    assert internals.local_rows_as_arrow(spark.range(3).repartition(2)) is None  # not a local relation
    assert internals.arrow_local_relation_threshold(spark) > 0
    assert internals.java_plan(projected) is not None


def test_deferred_local_relations_reach_the_jvm_on_first_use(spark):
    table = pa.table({"k": pa.array([3, 1], pa.int64())})
    deferred = internals.deferred_local_relation(spark, table, spark.createDataFrame(table).schema)
    assert internals.is_deferred(deferred)
    assert sorted(row.k for row in deferred.collect()) == [1, 3]
    assert not internals.is_deferred(deferred)


def test_the_jvm(spark):
    assert internals.missing_class(spark, "org.apache.spark.sql.delta.DeltaLog") is None
    assert "ClassNotFoundException" in (internals.missing_class(spark, "org.example.Nothing") or "")
    internals.quiet_loggers(spark, ["org.example.quiet"])
    before = internals.set_default_time_zone(spark, "Asia/Kolkata")
    assert internals.set_default_time_zone(spark, before) == "Asia/Kolkata"
    assert internals.hadoop_configuration(spark).get("fs.defaultFS") is not None


def test_pysparks_own_class_lookups_cost_no_jvm_call(spark, monkeypatch):
    """The session pins PySpark's per-call class lookups (`pin_pyspark_classes`): building
    SQL, selects, drops and functions asks the JVM nothing about classes, and still works."""
    from py4j.java_gateway import GatewayClient
    from pyspark.sql import functions as F

    def steps():
        return spark.sql("SELECT 1 AS a, 2 AS b").select(F.col("a") + F.lit(1), "b").drop("b")

    steps()  # each member is looked up once
    sent: list[str] = []
    send = GatewayClient.send_command
    monkeypatch.setattr(GatewayClient, "send_command",
                        lambda client, command, *args, **kwargs: (sent.append(command), send(client, command, *args,
                                                                                               **kwargs))[1])
    frame = steps()
    assert [command.split("\n")[:4] for command in sent if command.startswith("r\n")] == []
    assert frame.first()[0] == 2
    internals.pin_pyspark_classes(spark)  # again: nothing changes
    assert spark.sql("SELECT 3 AS c").select(F.col("c")).first()[0] == 3


def _table(spark, uri: str, rows: int = 4) -> None:
    (spark.range(rows).selectExpr("id AS k", "CAST(id AS STRING) AS s").write.format("delta")
     .option("delta.enableDeletionVectors", "true").save(uri))


def test_logs_snapshots_and_checksums(spark, tmp_path):
    uri = str(tmp_path / "t")
    _table(spark, uri)
    log, snapshot = internals.latest_snapshot(spark, uri)
    assert internals.snapshot_version(snapshot) == 0 and internals.plain_layout(snapshot)
    listed = internals.checksum_files(snapshot)
    assert listed is not None and listed[1] >= 1
    path, has_vector, stats = internals.added_file(next(internals.scala_items(listed[0])))
    assert path.endswith(".parquet") and not has_vector and json.loads(stats)["numRecords"] >= 1
    assert sorted(row.k for row in internals.files_frame(spark, log, snapshot, listed[0]).collect()) == [0, 1, 2, 3]
    assert internals.table_properties(snapshot)["delta.enableDeletionVectors"] == "true"
    assert [field["name"] for field in json.loads(internals.table_schema_json(snapshot))["fields"]] == ["k", "s"]


def test_the_held_snapshot_is_taken_only_while_its_commit_is_the_tables_newest(spark, tmp_path):
    """After this process's commit, the snapshot Delta holds is taken without listing the
    log; a commit of another writer, or the table deleted and made again at the same
    version, makes the log be listed again (and a transaction start there)."""
    import shutil

    from deltalake import write_deltalake

    from airflow_backfill.engine.delta.log import still_newest

    uri = str(tmp_path / "t")
    _table(spark, uri)
    spark.range(4, 6).selectExpr("id AS k", "CAST(id AS STRING) AS s").write.format("delta").mode("append").save(uri)
    log, snapshot = internals.latest_snapshot(spark, uri, still_newest(uri))
    assert snapshot.equals(log.unsafeVolatileSnapshot()) and internals.snapshot_version(snapshot) == 1

    write_deltalake(uri, pa.table({"k": pa.array([9], pa.int64()), "s": ["9"]}), mode="append")
    _, snapshot = internals.latest_snapshot(spark, uri, still_newest(uri))
    assert internals.snapshot_version(snapshot) == 2
    assert DeltaTransaction(spark, uri, "app", still_newest(uri)).snapshot.version() == 2

    shutil.rmtree(uri)  # made again, at the version the JVM holds, with other rows
    write_deltalake(uri, pa.table({"k": pa.array([1], pa.int64()), "s": ["a"]}))
    write_deltalake(uri, pa.table({"k": pa.array([2], pa.int64()), "s": ["b"]}), mode="append")
    write_deltalake(uri, pa.table({"k": pa.array([3], pa.int64()), "s": ["c"]}), mode="append")
    log, snapshot = internals.latest_snapshot(spark, uri, still_newest(uri))
    assert internals.snapshot_version(snapshot) == 2
    files = internals.checksum_files(snapshot)
    rows = internals.files_frame(spark, log, snapshot, files[0]) if files else spark.read.format("delta").load(uri)
    assert sorted(row.k for row in rows.collect()) == [1, 2, 3]


def test_a_transaction_of_the_engines_own(spark, tmp_path):
    """Files written by the transaction, one file replaced by the driver's add action, rows
    of another marked in a deletion vector, committed in one log entry with the app
    transaction; then Delta's own write command in a second one."""
    uri = str(tmp_path / "t")
    _table(spark, uri)
    transaction = DeltaTransaction(spark, uri, "app")
    assert not transaction.creating
    with transaction.active():
        transaction.read_whole_table()
        files = internals.checksum_files(transaction.snapshot)
        assert files is not None
        written = transaction.write_files(spark.range(10, 12).selectExpr("id AS k", "CAST(id AS STRING) AS s"))
        touched = transaction.rows_meeting(files[0], "t.k = 1", "t")
        assert [replaced for _, replaced, _ in touched] == [False] * len(touched) and touched
        kept_and_removed = [action for added, _, vector in touched
                            for action in transaction.without_rows(added, vector)]
        operation = transaction.write_operation("Append", None, "{}", None)
        transaction.commit(transaction.sequence([*written, *kept_and_removed]), operation,
                           transaction.string_map({}), "app", 7)
    assert DeltaTable(uri).transaction_version("app") == 7
    assert sorted(row.k for row in spark.read.format("delta").load(uri).collect()) == [0, 2, 3, 10, 11]

    second = DeltaTransaction(spark, uri, "app")
    with second.active():
        actions, tags = second.write_into_delta("Append", {}, {}, spark.range(20, 21).selectExpr(
            "id AS k", "CAST(id AS STRING) AS s"))
        live = next(internals.scala_items(internals.checksum_files(second.snapshot)[0]))
        assert second.removed(live, 0).getClass().getSimpleName() == "RemoveFile"
        assert second.added({"path": "x.parquet", "partitionValues": {}, "size": 1, "modificationTime": 0,
                             "dataChange": True}).getClass().getSimpleName() == "AddFile"
        second.commit(actions, second.write_operation("Append", None, "{}", None), tags, "app", 8)
    assert DeltaTable(uri).transaction_version("app") == 8
    assert sorted(row.k for row in spark.read.format("delta").load(uri).collect()) == [0, 2, 3, 10, 11, 20]
