"""The one door to Spark's, Delta's and PySpark's private classes.

The engine reaches below the public APIs in a few places, each for a measured reason (a
Spark job or a rebuild of a table's state saved per round). Every such call is made here,
and only here, so that a new delta-spark or PySpark that changes one of them breaks in
one module, with the name of the call: `tests/test_internals.py` calls each entry point
against the pinned versions and fails naming the one whose shape changed.
docs/contributing.md lists each entry point with the public API that would replace it.
"""

from __future__ import annotations

import functools
import json
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType


DELTA = "org.apache.spark.sql.delta"
PYTHON_UTILS = "org.apache.spark.api.python.PythonUtils"


class InternalsChanged(RuntimeError):
    """A private class or method the engine calls is not there or not shaped as it was."""


def _call(name: str, function: Any, *args: Any) -> Any:
    """`function(*args)`, with a failure of the call's shape reported by `name`."""
    from py4j.protocol import Py4JError

    try:
        return function(*args)
    except (AttributeError, TypeError) as error:
        raise InternalsChanged(f"{name}: {error}") from error
    except Py4JError as error:
        if "does not exist in the JVM" in str(error) or "Method " in str(error):
            raise InternalsChanged(f"{name}: {error}") from error
        raise


@functools.cache
def java_class(jvm: Any, name: str) -> Any:
    """The JVM class `name` (its full name, `$` for a Scala object) in one lookup, kept per
    gateway. Why: reaching a class through py4j's packages (`jvm.org.apache.spark...`) asks
    the JVM for every prefix as a class first, and each failing lookup searches every jar
    of the class path: 2.5 ms for a class five packages deep, 0.08 ms by its full name."""
    return getattr(jvm, name)


@functools.cache
def static_method(jvm: Any, class_name: str, method: str) -> Any:
    """The static method `method` of the JVM class `class_name`, kept per gateway: py4j asks
    the JVM what a class's attribute is on every access."""
    return _call(f"{class_name}.{method}", getattr, java_class(jvm, class_name), method)


@functools.cache
def scala_object(jvm: Any, name: str) -> Any:
    """The instance of the Scala object `name` (its class is `name$`), kept per gateway."""
    return getattr(java_class(jvm, f"{name}$"), "MODULE$")


@functools.cache
def scala_none(jvm: Any) -> Any:
    """Scala's `None` (one object, kept per gateway)."""
    return static_method(jvm, "scala.Option", "apply")(None)


def scala_some(jvm: Any, value: Any) -> Any:
    """`Option(value)`: Scala's `None` for a Python None."""
    return static_method(jvm, "scala.Option", "apply")(value)


class _PinnedClass:
    """A JVM class whose members are looked up once (`static_method`), standing where
    PySpark looks the class up by its short name on every call."""

    def __init__(self, jvm: Any, name: str) -> None:
        self._jvm, self._name = jvm, name

    def __getattr__(self, member: str) -> Any:
        return static_method(self._jvm, self._name, member)


FUNCTIONS = "org.apache.spark.sql.functions"
PINNED_CLASSES = {"PythonUtils": PYTHON_UTILS, "functions": FUNCTIONS, FUNCTIONS: FUNCTIONS}
"""PySpark's spellings of the classes it calls on every DataFrame step, and their full names."""


def pin_pyspark_classes(spark: SparkSession) -> None:
    """Make PySpark's own lookups of `PINNED_CLASSES` (`sc._jvm.PythonUtils.toSeq(...)` in
    every `spark.sql`, `select` or `drop`; `functions`, by its short and full names, in
    every Column) cost no JVM call. Why: py4j resolves a short class name against every
    package PySpark imported, a failing `Class.forName` each (0.65 ms), then asks what the
    member is (0.1 ms): a shared-forward round of an aggregate made 36 such lookups. The
    pinned names stand in the gateway's view as attributes, which Python finds before
    py4j's `__getattr__`."""
    jvm: Any = spark._jvm
    for short, name in PINNED_CLASSES.items():
        if not isinstance(vars(jvm).get(short), _PinnedClass):
            java_class(jvm, name)  # fails here, naming the class, if it is gone
            setattr(jvm, short, _PinnedClass(jvm, name))


# ---- Spark: plans of a DataFrame ---------------------------------------------------------


def java_plan(frame: DataFrame) -> Any:
    """The frame's Java `Dataset` (PySpark's `DataFrame._jdf`)."""
    return _call("DataFrame._jdf", lambda: frame._jdf)


def analyzed_plan(frame: DataFrame) -> Any:
    """The frame's analysed logical plan (`QueryExecution.analyzed`)."""
    return _call("QueryExecution.analyzed", lambda: java_plan(frame).queryExecution().analyzed())


def optimized_plan(frame: DataFrame) -> Any:
    """The frame's optimised logical plan (`QueryExecution.optimizedPlan`)."""
    return _call("QueryExecution.optimizedPlan", lambda: java_plan(frame).queryExecution().optimizedPlan())


def plan_kind(plan: Any) -> str:
    """The name of a logical plan node (`TreeNode.nodeName`: its simple class name,
    `LocalRelation`, `Filter`, ...), in one JVM call."""
    return str(_call("LogicalPlan.nodeName", plan.nodeName))


def leaf_kinds(plan: Any) -> list[str]:
    """The class names of a plan's leaves (`LogicalPlan.collectLeaves`)."""
    leaves = _call("LogicalPlan.collectLeaves", lambda: plan.collectLeaves())
    return [plan_kind(leaf) for leaf in scala_items(leaves)]


def local_rows_as_arrow(frame: DataFrame) -> pa.Table | None:
    """The rows of a frame whose optimised plan is a local relation, converted to Arrow in
    the JVM by Spark's own converter (`ArrowConverters.toBatchWithSchemaIterator`, what
    `toArrow` runs inside its job): no Spark job, and no value passes through a Python
    object, so timestamps stay instants whatever the process's time zone. None when the
    plan is not a local relation."""
    import pyarrow as pa

    plan = optimized_plan(frame)
    if plan_kind(plan) != "LocalRelation":
        return None
    jvm: Any = frame.sparkSession._jvm
    converters = _call("ArrowConverters$.MODULE$",
                       lambda: scala_object(jvm, "org.apache.spark.sql.execution.arrow.ArrowConverters"))
    batches = _call("ArrowConverters.toBatchWithSchemaIterator", converters.toBatchWithSchemaIterator,
                    plan.data().iterator(), plan.schema(), 1 << 20, 1 << 62, "UTC", True, False)
    tables = []
    while batches.hasNext():
        tables.append(pa.ipc.open_stream(bytes(batches.next())).read_all())
    if not tables:
        empty = _call("ArrowConverters.createEmptyArrowBatch", converters.createEmptyArrowBatch,
                      plan.schema(), "UTC", True, False)
        return pa.ipc.open_stream(bytes(empty)).read_all()
    return pa.concat_tables(tables)


def arrow_as_frame(spark: SparkSession, table: pa.Table, schema: StructType) -> DataFrame:
    """Arrow rows as a DataFrame of `schema`, made as PySpark's `createDataFrame(table,
    schema=schema)` makes it: its own conversions of the rows (timestamps localized and
    truncated, the table cast to the Arrow types Spark reads) and the same JVM calls
    (`PythonSQLUtils.readArrowStreamFromFile`, `PythonSQLUtils.toDataFrame`), so Spark gets
    the same batches and builds the same plan. Why: PySpark's method asks the JVM 44 times
    per call (its settings read one by one, its checks), 18 ms for a round's few rows; this
    asks 5 times, 8 ms, and a round makes up to three such frames. A session that encrypts
    its local files gets PySpark's method (its rows go over a socket, not a file)."""
    import os
    import tempfile

    from pyspark.sql import DataFrame
    from pyspark.sql.pandas.serializers import ArrowStreamSerializer
    from pyspark.sql.pandas.types import _check_arrow_table_timestamps_localize, to_arrow_schema

    context: Any = spark.sparkContext
    table = _without_empty_chunks(table)
    if context._encryption_enabled:
        return spark.createDataFrame(table, schema=schema)
    conf = _session_conf(spark)
    if schema.fields:
        zone = str(_call("SQLConf.sessionLocalTimeZone", conf.sessionLocalTimeZone))
        large = bool(_call("SQLConf.arrowUseLargeVarTypes", conf.arrowUseLargeVarTypes))
        table = _check_arrow_table_timestamps_localize(table, schema, True, zone).cast(to_arrow_schema(
            schema, error_on_duplicated_field_names_in_struct=True, timezone="UTC", prefers_large_types=large))
    batches = table.to_batches(max_chunksize=int(_call("SQLConf.arrowMaxRecordsPerBatch",
                                                        conf.arrowMaxRecordsPerBatch)))
    utils = "org.apache.spark.sql.api.python.PythonSQLUtils"
    with tempfile.NamedTemporaryFile(delete=False, dir=context._temp_dir) as stream:
        try:
            ArrowStreamSerializer().dump_stream(iter(batches), stream)
            stream.close()
            read = _call("PythonSQLUtils.readArrowStreamFromFile",
                         static_method(spark._jvm, utils, "readArrowStreamFromFile"), stream.name)
        finally:
            os.unlink(stream.name)
    made = _call("PythonSQLUtils.toDataFrame", static_method(spark._jvm, utils, "toDataFrame"), read, schema.json(),
                 spark._jsparkSession)
    frame = DataFrame(made, spark)
    frame._schema = schema  # as PySpark's method sets it: no JVM call to read it back
    return frame


def _without_empty_chunks(table: pa.Table) -> pa.Table:
    """`table` in one chunk per column when some chunk is empty or some column has none:
    Spark's reader of an Arrow stream (under PySpark's method too) stops at the first batch
    of no rows and drops every row after it (a range's feed with a change file of no rows
    made one), and PySpark's timestamp localization cannot rebuild a nested or dictionary
    column of no chunks (an Arrow filter that keeps no row leaves its columns so)."""
    import pyarrow as pa

    if all(column.num_chunks and all(len(chunk) for chunk in column.chunks) for column in table.columns):
        return table
    if table.num_rows:
        return table.combine_chunks()
    return pa.Table.from_arrays([pa.array([], field.type) for field in table.schema], schema=table.schema)


_SESSION_CONFS: weakref.WeakKeyDictionary[SparkSession, Any] = weakref.WeakKeyDictionary()


def _session_conf(spark: SparkSession) -> Any:
    """The session's `SQLConf` (what PySpark's `_jconf` asks the JVM for, twice, on every
    read): one object for the session's life, whose methods read its current settings."""
    if spark not in _SESSION_CONFS:
        _SESSION_CONFS[spark] = _call("SparkSession._jconf", lambda: spark._jconf)
    return _SESSION_CONFS[spark]


def local_relation_rows(frame: DataFrame) -> int:
    """The rows of a frame whose optimised plan is a local relation (`LocalRelation.data`)."""
    return int(_call("LocalRelation.data", lambda: optimized_plan(frame).data().size()))


def arrow_local_relation_threshold(spark: SparkSession) -> int:
    """Spark's `spark.sql.execution.arrow.localRelationThreshold`, as its SQL conf reads it."""
    return int(_call("SQLConf.arrowLocalRelationThreshold", _session_conf(spark).arrowLocalRelationThreshold))


# ---- Delta: logs, snapshots and the file lists of checksums ------------------------------


def delta_log(spark: SparkSession, uri: str) -> Any:
    """Delta's log of the table at `uri` (`DeltaLog.forTable`, cached per JVM), with `spark`
    made this thread's active session first: Delta builds its DataFrames in the active
    session, and a process that keeps several sessions (one per thread) must get them in
    the one its temporary views live in."""
    jvm: Any = spark._jvm
    make_active(spark)
    return _call("DeltaLog.forTable", lambda: static_method(jvm, f"{DELTA}.DeltaLog", "forTable")(
        spark._jsparkSession, uri))


def make_active(spark: SparkSession) -> None:
    """`spark` as the JVM's active session for this thread (`SparkSession.setActiveSession`)."""
    jvm: Any = spark._jvm
    _call("SparkSession.setActiveSession",
          lambda: static_method(jvm, "org.apache.spark.sql.SparkSession", "setActiveSession")(spark._jsparkSession))


@dataclass(frozen=True)
class CommitFile:
    """The commit file a snapshot ends with (`_delta_log/<version>.json`), as its file
    status tells it apart from a file written later at the same path."""

    version: int
    size: int
    modified_ms: int


IsNewest = Callable[[CommitFile], bool]
"""Whether a commit file is still the table's newest, asked of its storage."""


def latest_snapshot(spark: SparkSession, uri: str, is_newest: IsNewest | None = None) -> tuple[Any, Any]:
    """Delta's log of the table at `uri` and its latest snapshot, without rebuilding the
    table's state: the snapshot the JVM holds when `is_newest` says the commit it ends
    with is still the table's newest, else the log listed again (`DeltaLog.update`)."""
    log = delta_log(spark, uri)
    held = held_snapshot(log, is_newest) if is_newest is not None else None
    if held is not None:
        return log, held
    none = scala_none(spark._jvm)
    return log, _call("DeltaLog.update", log.update, False, none, none)


def held_snapshot(log: Any, is_newest: IsNewest) -> Any | None:
    """The snapshot Delta holds for the table (`DeltaLog.unsafeVolatileSnapshot`: after a
    commit of this process, the committed version) when `is_newest` says the commit file it
    ends with is the table's newest; None otherwise. Why: `DeltaLog.update` lists the whole
    `_delta_log` folder of a table on a file system (15 - 50 ms, growing with the table's
    commits), twice or more a round, where two file statuses tell the same for a table only
    this process writes."""
    snapshot = _call("DeltaLog.unsafeVolatileSnapshot", log.unsafeVolatileSnapshot)
    version = snapshot_version(snapshot)
    deltas = _call("LogSegment.deltas", lambda: snapshot.logSegment().deltas())
    if version < 0 or deltas.isEmpty():  # no table, or a snapshot that ends at a checkpoint
        return None
    last = deltas.last()
    held = CommitFile(version, int(_call("FileStatus.getLen", last.getLen)),
                      int(_call("FileStatus.getModificationTime", last.getModificationTime)))
    return snapshot if is_newest(held) else None


def snapshot_version(snapshot: Any) -> int:
    return int(_call("Snapshot.version", snapshot.version))


def plain_layout(snapshot: Any) -> bool:
    """Whether the table is neither partitioned nor maps column names (`Metadata`)."""
    metadata = _call("Snapshot.metadata", snapshot.metadata)
    partitioned = not _call("Metadata.partitionColumns", metadata.partitionColumns).isEmpty()
    mapping = str(_call("Metadata.columnMappingMode", lambda: metadata.columnMappingMode().name()))
    return not partitioned and mapping == "none"


def checksum_files(snapshot: Any) -> tuple[Any, int] | None:
    """The live files the snapshot's checksum lists (`VersionChecksum.allFiles`, a Scala
    `Seq[AddFile]`) and how many; None when it lists none."""
    checksum = _call("Snapshot.checksumOpt", snapshot.checksumOpt)
    if not checksum.isDefined():
        return None
    files = _call("VersionChecksum.allFiles", lambda: checksum.get().allFiles())
    return (files.get(), int(files.get().size())) if files.isDefined() else None


def files_frame(spark: SparkSession, log: Any, snapshot: Any, files: Any) -> DataFrame:
    """The table's rows in exactly `files` (`DeltaLog.createDataFrame`: deletion vectors and
    column types applied as Delta's reader applies them)."""
    from pyspark.sql import DataFrame

    none = scala_none(spark._jvm)
    return DataFrame(_call("DeltaLog.createDataFrame", log.createDataFrame, snapshot, files, False, none), spark)


def added_file(added: Any) -> tuple[str, bool, str | None]:
    """An `AddFile`'s path, whether it has a deletion vector, and its statistics' JSON."""
    return (str(_call("AddFile.path", added.path)), _call("AddFile.deletionVector", added.deletionVector) is not None,
            _call("AddFile.stats", added.stats))


def table_properties(snapshot: Any) -> dict[str, str]:
    """The table's properties (`Metadata.json`, the log's `metaData` action: two JVM calls,
    where reading its `configuration` map key by key takes three a property)."""
    action = json.loads(str(_call("Metadata.json", lambda: snapshot.metadata().json())))
    return {str(key): str(value) for key, value in action["metaData"].get("configuration", {}).items()}


def table_schema_json(snapshot: Any) -> str:
    """The table's schema as Spark's JSON (`Snapshot.schema`)."""
    return str(_call("Snapshot.schema", lambda: snapshot.schema().json()))


# ---- Delta: a transaction of the engine's own ---------------------------------------------


class DeltaTransaction:
    """Delta's `OptimisticTransaction` on one table, opened, written to and committed by the
    engine itself (`delta/transaction_write.py` says why): its conflict checks are Delta's."""

    def __init__(self, spark: SparkSession, uri: str, app_id: str | None, is_newest: IsNewest | None = None) -> None:
        """Start at the snapshot the JVM holds when `is_newest` says it is the latest
        (`held_snapshot`), else at the log listed again. `app_id`: the app transaction a
        concurrent commit of fails this one (None: a commit that records none)."""
        self._spark = spark
        self._jvm: Any = spark._jvm
        self.log = delta_log(spark, uri)
        held = held_snapshot(self.log, is_newest) if is_newest is not None else None
        if held is None:
            self._java = _call("DeltaLog.startTransaction", self.log.startTransaction)
        else:
            self._java = _call("DeltaLog.startTransaction", self.log.startTransaction, scala_none(self._jvm),
                               scala_some(self._jvm, held))
        if app_id is not None:  # commits of app_id conflict
            _call("OptimisticTransaction.readTxn", lambda: self._java.readTxn().append(app_id))
        self.creating = int(_call("OptimisticTransaction.readVersion", self._java.readVersion)) < 0

    @property
    def snapshot(self) -> Any:
        return _call("OptimisticTransaction.snapshot", self._java.snapshot)

    @contextmanager
    def active(self) -> Iterator[None]:
        """The transaction as the session's active one, as Delta's own commands set theirs:
        the write's scans register their reads with it."""
        active = _call("OptimisticTransaction$.MODULE$",
                       lambda: scala_object(self._jvm, f"{DELTA}.OptimisticTransaction"))
        _call("OptimisticTransaction.setActive", active.setActive, self._java)
        try:
            yield
        finally:
            active.clearActive()

    def read_whole_table(self) -> None:
        """Count the whole table as read: any concurrent commit of files conflicts."""
        _call("OptimisticTransaction.readWholeTable", self._java.readWholeTable)

    def write_files(self, frame: DataFrame) -> list[Any]:
        """Write `frame` as data files of the table (`TransactionalWrite.writeFiles`); their actions."""
        return list(scala_items(_call("OptimisticTransaction.writeFiles", self._java.writeFiles, java_plan(frame))))

    def write_into_delta(self, mode: str, options: Mapping[str, str], properties: Mapping[str, str],
                         frame: DataFrame) -> tuple[Any, Any]:
        """Delta's own write command for `frame` (`WriteIntoDelta.writeAndReturnCommitData`:
        appends, overwrites, `replaceWhere`, `replaceOn`) in this transaction; its actions
        and tags, not committed."""
        jvm = self._jvm
        jspark = self._spark._jsparkSession
        none = scala_none(jvm)
        configuration = self.string_map({})
        if self.creating:  # what Delta's data source makes of `delta.*` writer options
            configuration = _call("DeltaConfigs.validateConfigurations", lambda: scala_object(
                jvm, f"{DELTA}.DeltaConfigs").validateConfigurations(self.string_map(properties)))
        delta_options = _call("DeltaOptions", lambda: java_class(jvm, f"{DELTA}.DeltaOptions")(
            self.string_map(options), jspark.sessionState().conf()))
        command = _call("WriteIntoDelta", java_class(jvm, f"{DELTA}.commands.WriteIntoDelta"), self.log,
                        self._save_mode(mode),
                        delta_options, self.sequence([]), configuration, java_plan(frame), none, none, False)
        written = _call("WriteIntoDelta.writeAndReturnCommitData", command.writeAndReturnCommitData, self._java,
                        jspark, none, False)
        return written.actions(), written.stringTags()

    def added(self, add: Mapping[str, Any]) -> Any:
        """An add action from its JSON form (`Action.fromJson`)."""
        return self.action("add", add)

    def change_file(self, cdc: Mapping[str, Any]) -> Any:
        """A change file's action (`AddCDCFile`) from its JSON form."""
        return self.action("cdc", cdc)

    def action(self, kind: str, fields: Mapping[str, Any]) -> Any:
        """A log action of `kind` (`add`, `remove`, `cdc`) from its JSON form."""
        return _call("Action.fromJson", lambda: static_method(self._jvm, f"{DELTA}.actions.Action", "fromJson")(
            json.dumps({kind: dict(fields)})))

    @staticmethod
    def removed(added: Any, timestamp_ms: int) -> Any:
        """The remove action of a live file (`AddFile.removeWithTimestamp`, data changed)."""
        return _call("AddFile.removeWithTimestamp", added.removeWithTimestamp, timestamp_ms, True)

    def rows_meeting(self, files: Any, condition: str, alias: str) -> list[tuple[Any, bool, Any]]:
        """The files of `files` holding rows that meet `condition` (SQL over the table named
        `alias`), found by Delta's own scan for a DELETE with deletion vectors
        (`DMLWithDeletionVectorsHelper.findTouchedFiles`, which writes their new vectors):
        per file, its `AddFile`, whether every row meets it, and its new deletion vector."""
        jspark = self._spark._jsparkSession
        snapshot = self.snapshot
        index = _call("TahoeBatchFileIndex", lambda: java_class(self._jvm, f"{DELTA}.files.TahoeBatchFileIndex")(
            jspark, "delete", files, self.log, self.log.dataPath(), snapshot, False))
        table = files_frame(self._spark, self.log, snapshot, files)
        matching = analyzed_plan(table.alias(alias).filter(condition))  # Filter(condition, table)
        helper = _call("DMLWithDeletionVectorsHelper$.MODULE$",
                       lambda: scala_object(self._jvm, f"{DELTA}.commands.DMLWithDeletionVectorsHelper"))
        scan = _call("DMLWithDeletionVectorsHelper.createTargetDfForScanningForMatches",
                     helper.createTargetDfForScanningForMatches, jspark, matching.child(), index)
        touched = _call("DMLWithDeletionVectorsHelper.findTouchedFiles", helper.findTouchedFiles, jspark, self._java,
                        True, self.log, scan, index, matching.condition(), "DELETE")
        return [(file.fileLogEntry(), bool(file.isFullyReplaced()), file.newDeletionVector())
                for file in scala_items(touched)]

    @staticmethod
    def without_rows(added: Any, vector: Any) -> tuple[Any, Any]:
        """A file with `vector` marking its removed rows (`AddFile.removeRows`): the file
        again with its new vector and its statistics' bounds marked wide, and the removal
        of the file as it was."""
        pair = _call("AddFile.removeRows", added.removeRows, vector, True, True)
        return pair._1(), pair._2()

    def write_operation(self, mode: str, predicate: str | None, user_metadata: str, replace_on: str | None) -> Any:
        """The commit's operation, as Delta's writer records it (`DeltaOperations.Write`)."""
        jvm = self._jvm
        none = scala_none(jvm)
        write = java_class(jvm, f"{DELTA}.DeltaOperations$Write")
        return _call("DeltaOperations.Write", write, self._save_mode(mode), scala_some(jvm, self.sequence([])),
                     scala_some(jvm, predicate), scala_some(jvm, user_metadata), none, none, none,
                     scala_some(jvm, replace_on), none)

    def commit(self, actions: Any, operation: Any, tags: Any, app_id: str | None, version: int | None) -> None:
        """Commit `actions` with the app transaction (`app_id`, `version`) in one log entry;
        with no app id, a commit that leaves every app transaction as it was."""
        if app_id is not None and version is not None:
            now = static_method(self._jvm, "java.lang.Long", "valueOf")(int(time.time() * 1000))
            _call("OptimisticTransaction.updateSetTransaction", self._java.updateSetTransaction, app_id, version,
                  scala_some(self._jvm, now))
        _call("OptimisticTransaction.commit", self._java.commit, actions, operation, tags)

    def compaction_operation(self) -> Any:
        """The operation of a commit that rewrites files without changing a row, as Delta's
        automatic compaction records it (`DeltaOperations.Optimize`, `auto`)."""
        optimize = java_class(self._jvm, f"{DELTA}.DeltaOperations$Optimize")
        return _call("DeltaOperations.Optimize", optimize, self.sequence([]), self.sequence([]), True,
                     scala_none(self._jvm), False)

    def sequence(self, items: Iterable[Any]) -> Any:
        """A Scala `Seq` of `items`."""
        listed = java_class(self._jvm, "java.util.ArrayList")()
        for item in items:
            listed.add(item)
        return _call("PythonUtils.toSeq", lambda: static_method(self._jvm, PYTHON_UTILS, "toSeq")(listed))

    def string_map(self, values: Mapping[str, str]) -> Any:
        """A Scala `Map[String, String]`."""
        return _call("PythonUtils.toScalaMap",
                     lambda: static_method(self._jvm, PYTHON_UTILS, "toScalaMap")(dict(values)))

    def _save_mode(self, mode: str) -> Any:
        return getattr(java_class(self._jvm, "org.apache.spark.sql.SaveMode"), mode)


# ---- PySpark: the DataFrame of a Java plan --------------------------------------------------


def deferred_local_relation(spark: SparkSession, table: pa.Table, schema: StructType) -> DataFrame:
    """Arrow rows as a DataFrame whose local relation reaches the JVM only when Spark first
    needs it: every DataFrame method reaches the JVM through PySpark's `_jdf`, which this
    subclass of PySpark's classic DataFrame makes on first use. Why: a round passes its
    small intermediate results from step to step as local relations, and most steps read
    them back as Arrow without asking Spark anything; handing rows to the JVM costs about
    0.15 s per 100,000 rows of a few columns (0.6 - 0.9 s of a TPC-H Q3 round at SF 10)."""
    return _call("pyspark.sql.classic.dataframe.DataFrame", lambda: _deferred_class()(spark, table, schema))


def is_deferred(frame: DataFrame) -> bool:
    """Whether `frame` is a `deferred_local_relation` whose rows have not reached the JVM."""
    return bool(getattr(frame, "deferred", False)) and type(frame).__name__ == "DeferredLocalRelation"


@functools.cache
def _deferred_class() -> type:
    from pyspark.sql.classic.dataframe import DataFrame as ClassicDataFrame

    class DeferredLocalRelation(ClassicDataFrame):
        def __init__(self, spark: SparkSession, table: pa.Table, schema: StructType) -> None:
            self._rows: tuple[pa.Table, StructType] | None = (table, schema)
            self._made: Any = None
            super().__init__(None, spark)  # type: ignore[arg-type]
            self.__dict__["schema"] = schema  # DataFrame.schema is a cached property: no JVM call

        @property  # type: ignore[override]
        def _jdf(self) -> Any:
            if self._made is None:
                assert self._rows is not None
                table, schema = self._rows
                self._made = arrow_as_frame(self._session, table, schema)._jdf
                self._rows = None
            return self._made

        @_jdf.setter
        def _jdf(self, value: Any) -> None:
            if value is not None:  # DataFrame.__init__ sets None: the relation is not made yet
                self._made = value

        @property
        def deferred(self) -> bool:
            return self._made is None

        def unpersist(self, blocking: bool = False) -> Any:
            """Nothing to release before the relation is made."""
            return self if self._made is None else super().unpersist(blocking)

    return DeferredLocalRelation


def hadoop_configuration(spark: SparkSession) -> Any:
    """The session's Hadoop configuration (`SparkContext._jsc.hadoopConfiguration`), where
    S3A's settings live."""
    return _call("SparkContext._jsc", lambda: spark.sparkContext._jsc.hadoopConfiguration())


# ---- the JVM ---------------------------------------------------------------------------


def set_default_time_zone(spark: SparkSession, zone: str) -> str:
    """Make `zone` the driver JVM's default time zone (`java.util.TimeZone.setDefault`);
    returns the zone it had. No public Spark setting reaches a driver that is already
    running (spark-submit starts it before this process)."""
    jvm: Any = spark._jvm
    time_zone = _call("java.util.TimeZone", lambda: java_class(jvm, "java.util.TimeZone"))
    before = str(time_zone.getDefault().getID())
    time_zone.setDefault(time_zone.getTimeZone(zone))
    _call("System.setProperty", lambda: java_class(jvm, "java.lang.System").setProperty("user.timezone", zone))
    return before


def quiet_loggers(spark: SparkSession, names: Iterable[str]) -> None:
    """Set the driver's log4j loggers `names` to ERROR (log4j 2's `Configurator`)."""
    jvm: Any = spark._jvm
    error = java_class(jvm, "org.apache.logging.log4j.Level").ERROR
    configurator = java_class(jvm, "org.apache.logging.log4j.core.config.Configurator")
    for name in names:
        _call("Configurator.setLevel", configurator.setLevel, name, error)


def missing_class(spark: SparkSession, name: str) -> str | None:
    """None when the driver JVM loads the class `name`; the JVM's message when it answers
    that the class is not there. Any other failure is raised as it is."""
    from py4j.protocol import Py4JJavaError

    jvm: Any = spark._jvm
    try:
        java_class(jvm, "java.lang.Class").forName(
            name, False, java_class(jvm, "java.lang.Thread").currentThread().getContextClassLoader())
    except Py4JJavaError as error:
        if error.java_exception.getClass().getName() != "java.lang.ClassNotFoundException":
            raise
        return str(error.java_exception.toString())
    return None


def is_commit_conflict(error: BaseException) -> bool:
    """Whether `error` is Delta's refusal of a commit that a concurrent commit conflicts with
    (a `DeltaConcurrentModificationException`): raised through py4j as it is, or as Delta's
    Python exception once a module has registered those (`delta.tables` does)."""
    from delta.exceptions import base
    from py4j.protocol import Py4JJavaError

    conflicts = (base.DeltaConcurrentModificationException, base.ConcurrentWriteException,  # siblings in Python
                 base.MetadataChangedException, base.ProtocolChangedException, base.ConcurrentAppendException,
                 base.ConcurrentDeleteReadException, base.ConcurrentDeleteDeleteException,
                 base.ConcurrentTransactionException)
    if isinstance(error, conflicts):
        return True
    if not isinstance(error, Py4JJavaError):
        return False
    kind = error.java_exception.getClass()
    while kind is not None:
        if str(kind.getSimpleName()) == "DeltaConcurrentModificationException":
            return True
        kind = kind.getSuperclass()
    return False


def scala_items(sequence: Any) -> Any:
    """The items of a Scala collection reached through py4j (a `Seq[AddFile]`, say)."""
    iterator = sequence.iterator()
    while iterator.hasNext():
        yield iterator.next()
