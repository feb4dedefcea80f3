"""Join Arrow tables on keys where NULL equals NULL, as GROUP BY and `<=>` treat them.

Arrow's hash join never matches NULL keys, so each key becomes two join columns: the
value with NULLs replaced by a value the column already holds, and whether it was NULL.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

_FILLED, _IS_NULL = "__join_filled_{}", "__join_null_{}"


def left_join_null_safe(left: pa.Table, right: pa.Table, keys: list[str]) -> pa.Table:
    """`left`'s rows, each with the non-key columns of the `right` row with the same key
    (NULLs when none). `right` must have unique keys; its key types are cast to `left`'s."""
    right = right.cast(pa.schema([left.schema.field(f.name) if f.name in keys else f for f in right.schema]))
    join_keys: list[str] = []
    for i, key in enumerate(keys):
        both = pa.chunked_array(left[key].chunks + right[key].chunks, type=left.schema.field(key).type)
        values = both.drop_null()
        left = left.append_column(_IS_NULL.format(i), pc.is_null(left[key]))
        right = right.append_column(_IS_NULL.format(i), pc.is_null(right[key]))
        join_keys.append(_IS_NULL.format(i))
        if len(values):  # all-NULL keys join on the flag alone
            left = left.append_column(_FILLED.format(i), pc.fill_null(left[key], values[0]))
            right = right.append_column(_FILLED.format(i), pc.fill_null(right[key], values[0]))
            join_keys.append(_FILLED.format(i))
    joined = left.join(right.drop_columns(keys), join_keys, join_type="left outer")
    return joined.drop_columns(join_keys)
