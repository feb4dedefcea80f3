"""Prove an integer key unique on the driver with one bit per possible key.

Why: a snapshot proves the upstream's key unique before it writes anything (a repeated
key would become two MV rows). Spark proves it by shuffling every key to count it: about
3 s of a 6 s snapshot of TPC-H's 6 M line items on two cores (docs/benchmarks.md). Most
keys are integers in a range the files' statistics give (ids, order numbers, line
numbers), and then a bitmap over that range settles it in one pass over the key columns
in any row order: a key whose bit is already set is held twice. The files' key columns
are read one batch at a time, so the driver holds the bitmap (at most `sizes.key_bitmap_bits` bits)
and one batch.

A file with a deletion vector still holds the rows it hides, so a key found twice in the
files may be held once by the table: the answer is then "no proof", never an error, and
the caller counts the live keys with Spark. So is a NULL key part, or a value outside
the statistics' range.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from airflow_backfill.engine.sizes import sizes
from airflow_backfill.storage.files import parquet_batches

if TYPE_CHECKING:
    from collections.abc import Sequence

log = logging.getLogger(__name__)

BATCH_ROWS = 65_536
"""Key rows decoded at a time, by this proof and `ordered_keys` (1 MiB for a key of two
8-byte columns)."""


def fits(ranges: Sequence[tuple[int, int]]) -> bool:
    """Whether keys in these (lowest, highest) ranges, one per key column, fit a bitmap."""
    return math.prod(high - low + 1 for low, high in ranges) <= sizes().key_bitmap_bits


def keys_unique_in_range(paths: Sequence[str], columns: Sequence[str], ranges: Sequence[tuple[int, int]],
                         batch_rows: int = BATCH_ROWS) -> bool:
    """True when no key of `columns` (integer columns whose values lie in `ranges`, the
    files' statistics) is held twice by the rows of the Parquet files at `paths`; False
    means no proof (not that a key repeats)."""
    if not fits(ranges):
        return False
    widths = [high - low + 1 for low, high in ranges]
    seen = np.zeros((math.prod(widths) + 7) // 8, dtype=np.uint8)
    try:
        for path in paths:
            for batch in parquet_batches(path, list(columns), batch_rows):
                positions = _positions([batch.column(name) for name in columns], ranges, widths)
                if positions is None or not _mark(seen, positions):
                    log.info("key %s not proved from the files' key ranges: %s holds a NULL part, a value outside "
                             "its statistics or a key twice", list(columns), path)
                    return False
    except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
        log.info("key %s not proved from the files' key ranges: %s", list(columns), error)
        return False
    return True


def _positions(keys: list[pa.Array], ranges: Sequence[tuple[int, int]], widths: list[int]) -> np.ndarray | None:
    """Each row's bit: its key parts' offsets in their ranges, combined (None when a part
    is NULL, not an integer or outside its range)."""
    positions = np.zeros(len(keys[0]), dtype=np.int64)
    for key, (low, high), width in zip(keys, ranges, widths, strict=True):
        if key.null_count or not pa.types.is_integer(key.type):
            return None
        values = key.to_numpy(zero_copy_only=False).astype(np.int64)
        if len(values) and (values.min() < low or values.max() > high):
            return None
        positions = positions * width + (values - low)
    return positions


def _mark(seen: np.ndarray, positions: np.ndarray) -> bool:
    """Set the positions' bits; False when one was set already or repeats in the batch."""
    ordered = np.sort(positions)  # a repeat within the batch sits next to itself
    if np.any(ordered[1:] == ordered[:-1]):
        return False
    index, masks = positions >> 3, np.left_shift(np.uint8(1), (positions & 7).astype(np.uint8))
    if np.any(seen[index] & masks):
        return False
    np.bitwise_or.at(seen, index, masks)
    return True
