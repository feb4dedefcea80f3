"""A Spark local relation of Arrow rows that reaches the JVM only when Spark needs it.

Why: a round passes its small intermediate results from step to step as local relations
(`driver_rows.local_relation`), and most steps read them back as Arrow (`arrow_of`) without
asking Spark anything. Handing rows to the JVM costs about 0.15 s per 100,000 rows of a
few columns (written to a file, read back, copied into rows): 0.6 - 0.9 s of a TPC-H Q3
round at SF 10, for relations no Spark plan ever read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyspark.sql.classic.dataframe import DataFrame
from pyspark.sql.dataframe import DataFrame as ParentDataFrame

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType


class DeferredLocalRelation(DataFrame):
    """Arrow rows and their Spark schema; every DataFrame method reaches the JVM through
    `_jdf`, which makes the local relation on first use."""

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
            self._made = self._session.createDataFrame(table, schema=schema)._jdf
            self._rows = None
        return self._made

    @_jdf.setter
    def _jdf(self, value: Any) -> None:
        if value is not None:  # DataFrame.__init__ sets None: the relation is not made yet
            self._made = value

    @property
    def deferred(self) -> bool:
        """Whether the JVM does not hold the relation yet."""
        return self._made is None

    def unpersist(self, blocking: bool = False) -> ParentDataFrame:
        """Nothing to release before the relation is made."""
        return self if self._made is None else super().unpersist(blocking)
