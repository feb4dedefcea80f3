"""Prove a table's key unique at a version from its data files, on the driver.

Why: the snapshot proves the upstream's key before it writes the MV, and a recompute
chosen before the feed proves it again; Spark counts the keys with a shuffle of every
row. The files' statistics and their key columns often prove it without one: a bitmap over
an integer key's range (`dense_keys`), or the keys' order across the files read in the
order of their smallest key (`ordered_keys`). When neither proves it, the caller counts
the keys with Spark.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import pyarrow as pa

from airflow_backfill.engine.delta.dense_keys import fits, keys_unique_in_range
from airflow_backfill.engine.delta.key_range import integer_key_ranges
from airflow_backfill.engine.delta.log import arrow_schema, open_upstream
from airflow_backfill.engine.delta.ordered_keys import keys_unique_in_order
from airflow_backfill.storage.uri import join

log = logging.getLogger(__name__)


def key_proved_from_files(uri: str, version: int, key: Sequence[str]) -> bool:
    """Whether the table's data files at `version` prove `key` unique on the driver, with
    no Spark job: by a bitmap over an integer key's range from the files' statistics
    (`dense_keys`), else by the order of their keys (`ordered_keys`). False when they
    cannot tell; the caller then counts the keys with Spark."""
    table = open_upstream(uri, version)
    names = {name.lower(): name for name in arrow_schema(table).names}
    columns = [names.get(column.lower(), column) for column in key]
    actions = pa.table(table.get_add_actions(flatten=True))
    paths = _paths_by_smallest_key(uri, actions, columns[0])
    ranges = integer_key_ranges(actions, columns)
    if ranges is not None and fits(ranges):
        proved, how = keys_unique_in_range(paths, columns, ranges), "the files' key ranges"
    else:
        proved, how = keys_unique_in_order(paths, columns), "the files' key order"
    if proved:
        log.info("key %s proved unique at epoch %s from %s", list(key), version, how)
    return proved


def _paths_by_smallest_key(uri: str, actions: pa.Table, column: str) -> list[str]:
    """The files in order of their smallest `column` (runs of keys that overlap show early),
    or by path when some file records none."""
    wanted = f"min.{column}".lower()
    minimum = next((name for name in actions.column_names if name.lower() == wanted), None)
    paths = [path if "://" in path or os.path.isabs(path) else join(uri, path)
             for path in actions.column("path").to_pylist()]
    lows = actions.column(minimum).to_pylist() if minimum else [None] * len(paths)
    if any(low is None for low in lows):
        return sorted(paths)
    return [path for _, path in sorted(zip(lows, paths, strict=True))]
