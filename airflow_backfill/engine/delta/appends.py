"""Ranges of upstream epochs that only appended rows, told apart from the Delta log alone.

Most live tables grow by appends (new orders, new events). A range of epochs whose
commits only add data files has a change feed that is exactly the rows of those files,
each an insert of a new upstream key, so a round over it needs no netting per key and no
MERGE: when the added keys all lie above the MV's largest key (read from the files'
statistics on both sides), the MV query over the added files is appended to the MV.
A backlog that starts with appends and then updates gets its append-only prefix as a
round of its own, so only the rest pays for a MERGE.
This module only reads the upstream's log with delta-rs; it decides nothing about the MV.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import pyarrow as pa

from airflow_backfill.engine.delta.key_range import KeyRange
from airflow_backfill.engine.delta.log import commit_actions
from airflow_backfill.storage.uri import join


@dataclass(frozen=True)
class AppendedFiles:
    """The data files a range of insert-only epochs added, and what their statistics say."""

    paths: tuple[str, ...]
    keys: KeyRange
    """The leading key column's range over the added rows; `present_rows` counts them all."""
    end_version: int
    """The last version of the append-only prefix (the range's end when it only appended)."""


def appended_prefix(source: str, watermark: int, end_version: int, key: pa.Field) -> AppendedFiles | None:
    """The files added by the longest prefix of versions (watermark, end_version] that
    only appended rows; None when the first version already did something else.

    A version ends the prefix when it changed rows in another way (change files,
    data-changing removes), added a file with a deletion vector, or added a file without
    statistics of the leading key `key` (an integer or date column): from there the rounds
    read the change feed.
    """
    paths: list[str] = []
    low: Any = None
    high: Any = None
    has_nulls = False
    rows = 0
    last = watermark
    for version in range(watermark + 1, end_version + 1):
        facts = _version_facts(source, version, key)
        if facts is None:
            break
        for path, file_rows, file_low, file_high, file_nulls in facts:
            paths.append(path)
            rows += file_rows
            has_nulls = has_nulls or file_nulls
            if file_low is not None:
                low = file_low if low is None else min(low, file_low)
                high = file_high if high is None else max(high, file_high)
        last = version
    if last == watermark:
        return None
    return AppendedFiles(tuple(paths), KeyRange(key.name, low, high, has_nulls, rows), last)


def _version_facts(source: str, version: int, key: pa.Field) -> list[tuple[str, int, Any, Any, bool]] | None:
    """(path, rows, low, high, has NULL keys) of each file `version` added; None unless the
    version only appended files whose statistics bound `key`."""
    added = _added_files(commit_actions(source, version))
    if added is None:
        return None
    facts = []
    for add in added:
        file_facts = _key_facts(add, key)
        if file_facts is None:
            return None
        facts.append((join(source, unquote(add["path"])), *file_facts))
    return facts


def _added_files(actions: Iterable[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The data-changing add actions of one commit; None unless the commit only added rows.

    Files moved without changing data (OPTIMIZE: add and remove with `dataChange` false)
    are not in the change feed and are ignored.
    """
    added = []
    for action in actions:
        if "cdc" in action:
            return None
        if "remove" in action and action["remove"].get("dataChange", True):
            return None
        if "add" in action and action["add"].get("dataChange", True):
            if action["add"].get("deletionVector"):
                return None
            added.append(action["add"])
    return added


def _key_facts(add: dict[str, Any], key: pa.Field) -> tuple[int, Any, Any, bool] | None:
    """(rows, lowest key, highest key, any NULL key) of one added file; None when unknown."""
    try:
        stats = json.loads(add.get("stats") or "null")
    except ValueError:
        return None
    if not isinstance(stats, dict) or "numRecords" not in stats:
        return None
    rows = int(stats["numRecords"])
    nulls = (stats.get("nullCount") or {}).get(key.name)
    if nulls is None:
        return None
    if rows == 0 or int(nulls) == rows:
        return rows, None, None, rows > 0
    low = _key_value((stats.get("minValues") or {}).get(key.name), key.type)
    high = _key_value((stats.get("maxValues") or {}).get(key.name), key.type)
    if low is None or high is None:
        return None
    return rows, low, high, int(nulls) > 0


def _key_value(value: Any, key_type: pa.DataType) -> Any:
    """A statistic of an integer or date column as a Python value (None for other types)."""
    if value is None:
        return None
    if pa.types.is_integer(key_type) and isinstance(value, int) and not isinstance(value, bool):
        return value
    if pa.types.is_date32(key_type) and isinstance(value, str):
        return datetime.date.fromisoformat(value[:10])
    return None
