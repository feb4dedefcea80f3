"""Rows of one Arrow table found by key in another, NULL-safely, as Spark's `<=>` finds them.

Arrow's hash join never matches NULL keys and carries only some column types as payload;
joining each key column's value (NULL replaced by a filler) together with its NULL flag
gives `<=>`, and joining row numbers alone lets any column be taken afterwards.
"""

from __future__ import annotations

import decimal
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_LEFT, _RIGHT = "__left_row", "__right_row"


def comparable_key(data_type: pa.DataType) -> bool:
    """Key types Arrow compares as Spark does: not floating point (Spark's joins and
    groupings take NaN as equal to NaN and -0.0 as 0.0), not nested."""
    return not (pa.types.is_floating(data_type) or pa.types.is_nested(data_type)
                or pa.types.is_dictionary(data_type))


def matching_rows(left: pa.Table, left_key: Sequence[str], right: pa.Table, right_key: Sequence[str]) -> pa.Array:
    """For each row of `left`, the index of the row of `right` whose key equals its key
    (`<=>`: NULL equals NULL), or NULL when there is none. `right`'s keys must be unique.
    Raises `pa.ArrowNotImplementedError` for key types Arrow does not join."""
    left_side = _join_columns(left, left_key, _LEFT)
    right_side = _join_columns(right, right_key, _RIGHT)
    keys = [name for name in left_side.column_names if name != _LEFT]
    joined = left_side.join(right_side, keys=keys, join_type="left outer", use_threads=False)
    joined = joined.sort_by(_LEFT)
    return joined.column(_RIGHT).combine_chunks()


def contains(left: pa.Table, left_key: Sequence[str], right: pa.Table, right_key: Sequence[str]) -> pa.Array:
    """For each row of `left`, whether `right` holds a row of its key (`<=>`)."""
    if right.num_rows == 0:
        return pa.array([False] * left.num_rows, pa.bool_())
    unique = right.select(list(right_key)).group_by(list(right_key), use_threads=False).aggregate([])
    return pc.is_valid(matching_rows(left, left_key, unique, right_key))


def _join_columns(table: pa.Table, key: Sequence[str], row_name: str) -> pa.Table:
    columns: dict[str, pa.Array] = {}
    for i, name in enumerate(key):
        column = table.column(name).combine_chunks()
        columns[f"__v{i}"] = pc.fill_null(column, _filler(column.type)) if column.null_count else column
        columns[f"__n{i}"] = pc.is_null(column)
    columns[row_name] = pa.array(np.arange(table.num_rows, dtype=np.int64))
    return pa.table(columns)


def _filler(data_type: pa.DataType) -> pa.Scalar:
    """A value of `data_type` to stand in for NULL (its NULL flag tells them apart)."""
    if pa.types.is_string(data_type) or pa.types.is_large_string(data_type):
        return pa.scalar("", data_type)
    if pa.types.is_binary(data_type) or pa.types.is_large_binary(data_type):
        return pa.scalar(b"", data_type)
    if pa.types.is_boolean(data_type):
        return pa.scalar(False)
    if pa.types.is_date32(data_type):
        return pa.array([0], pa.int32()).cast(data_type)[0]
    if pa.types.is_decimal(data_type):
        return pa.scalar(decimal.Decimal(0), data_type)
    return pa.array([0], pa.int64()).cast(data_type)[0]


def same_rows(left: pa.Table, right: pa.Table, key: Sequence[str]) -> pa.Array | None:
    """For each row of `left`, whether `right` holds a row of its key (`<=>`) equal to it in
    every column (NULL equal to NULL; a NaN never equal, so a row holding one counts as
    changed). Both have the same columns and types; `right`'s keys are unique. None when
    Arrow does not compare some column type."""
    if left.num_rows == 0 or right.num_rows == 0:
        return pa.array([False] * left.num_rows, pa.bool_())
    found = matching_rows(left, key, right, key)
    matched = pc.is_valid(found)
    aligned = right.take(pc.fill_null(found, 0))
    same = matched
    try:
        for name in left.column_names:
            a, b = left.column(name), aligned.column(name)
            equal = pc.or_(pc.fill_null(pc.equal(a, b), False), pc.and_(pc.is_null(a), pc.is_null(b)))
            same = pc.and_(same, equal)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError):
        return None
    return same
