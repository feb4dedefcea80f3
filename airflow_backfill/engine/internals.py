"""The one door to Spark's, Delta's and PySpark's private classes.

The engine reaches below the public APIs in a few places, each for a measured reason (a
Spark job or a rebuild of a table's state saved per round). Every such call is made here,
and only here, so that a new delta-spark or PySpark that changes one of them breaks in
one module, with the name of the call: `tests/test_internals.py` calls each entry point
against the pinned versions and fails naming the one whose shape changed.
docs/contributing.md lists each entry point with the public API that would replace it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession


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
    """The simple class name of a logical plan node (`LocalRelation`, `Filter`, ...)."""
    return str(_call("LogicalPlan.getClass", lambda: plan.getClass().getSimpleName()))


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
    converters = _call("ArrowConverters$.MODULE$", lambda: getattr(
        getattr(jvm.org.apache.spark.sql.execution.arrow, "ArrowConverters$"), "MODULE$"))
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


def local_relation_rows(frame: DataFrame) -> int:
    """The rows of a frame whose optimised plan is a local relation (`LocalRelation.data`)."""
    return int(_call("LocalRelation.data", lambda: optimized_plan(frame).data().size()))


def arrow_local_relation_threshold(spark: SparkSession) -> int:
    """Spark's `spark.sql.execution.arrow.localRelationThreshold`, as its SQL conf reads it."""
    return int(_call("SQLConf.arrowLocalRelationThreshold",
                     lambda: spark._jsparkSession.sessionState().conf().arrowLocalRelationThreshold()))


# ---- the JVM ---------------------------------------------------------------------------


def set_default_time_zone(spark: SparkSession, zone: str) -> str:
    """Make `zone` the driver JVM's default time zone (`java.util.TimeZone.setDefault`);
    returns the zone it had. No public Spark setting reaches a driver that is already
    running (spark-submit starts it before this process)."""
    jvm: Any = spark._jvm
    time_zone = _call("java.util.TimeZone", lambda: jvm.java.util.TimeZone)
    before = str(time_zone.getDefault().getID())
    time_zone.setDefault(time_zone.getTimeZone(zone))
    _call("System.setProperty", jvm.java.lang.System.setProperty, "user.timezone", zone)
    return before


def scala_items(sequence: Any) -> Any:
    """The items of a Scala collection reached through py4j (a `Seq[AddFile]`, say)."""
    iterator = sequence.iterator()
    while iterator.hasNext():
        yield iterator.next()
