"""Read the upstream's log store: its Change Data Feed for a range of epochs.

Before reading, the range is checked: every version in it must still have its log
entry and every file its change feed is made of (change files, or the added and removed
data files of commits without them), and the schema must not have changed since the
MV's watermark. A gap would make the MV silently skip changes, so it is an error that
says how to recover.
"""

from __future__ import annotations

import logging
import os
from urllib.parse import unquote

import pyarrow as pa

from airflow_backfill.engine.delta_log import arrow_schema, commit_actions, open_upstream
from airflow_backfill.exceptions import UpstreamError

log = logging.getLogger(__name__)


def check_schema_unchanged(source: str, watermark: int, end_version: int) -> None:
    """Refuse a range across which the upstream's schema changed (the MV would be wrong).

    The range's log entries are checked first: without them the old schema cannot be
    read, and the missing history is the error to report. Only a range with a metaData
    action can change the schema, so the two versions are loaded only then.
    """
    _check_versions_available(source, watermark, end_version)
    if not any("metaData" in action for version in range(watermark + 1, end_version + 1)
               for action in commit_actions(source, version)):
        return
    before = arrow_schema(open_upstream(source, watermark))
    after = arrow_schema(open_upstream(source, end_version))
    if before != after:
        raise UpstreamError(
            f"the upstream's schema changed between version {watermark} (the MV's watermark) "
            f"and {end_version}: {_schema_diff(before, after)}. The MV was left untouched; "
            "rebuild it with a new snapshot (delete the target and rerun the DAG)."
        )


def read_change_feed(source: str, watermark: int, end_version: int) -> pa.Table:
    """All change rows of versions (watermark, end_version], in one Arrow table."""
    table = open_upstream(source)
    _check_versions_available(source, watermark, end_version)
    _check_change_files_available(source, watermark, end_version)
    try:
        reader = table.load_cdf(starting_version=watermark + 1, ending_version=end_version)
        feed = _conform_feed(pa.table(reader.read_all()), arrow_schema(table))
    except Exception as error:
        raise UpstreamError(
            f"cannot read the upstream's change feed for versions {watermark + 1}..{end_version}: "
            f"{error}. The change files may have been vacuumed; rebuild the MV with a new snapshot."
        ) from None
    log.info("read %s change rows for upstream versions %s..%s", feed.num_rows, watermark + 1, end_version)
    return feed


def _conform_feed(feed: pa.Table, schema: pa.Schema) -> pa.Table:
    """Cast delta-rs' view types back to the table's plain types, which Spark reads."""
    fields = list(schema) + [
        pa.field("_change_type", pa.string()),
        pa.field("_commit_version", pa.int64()),
        pa.field("_commit_timestamp", pa.timestamp("us", tz="UTC")),
    ]
    target = pa.schema([field.with_nullable(True) for field in fields])
    return feed.select(target.names).cast(target)


def _check_versions_available(source: str, watermark: int, end_version: int) -> None:
    log_dir = os.path.join(source, "_delta_log")
    missing = [
        version
        for version in range(watermark + 1, end_version + 1)
        if not os.path.exists(os.path.join(log_dir, f"{version:020d}.json"))
    ]
    if missing:
        raise UpstreamError(
            f"the upstream's log no longer has version(s) {missing[0]}..{missing[-1]} needed to "
            f"catch up from watermark {watermark}: its log expired (delta.logRetentionDuration) "
            "or was cleaned up. Changes cannot be replayed; rebuild the MV with a new snapshot."
        )


def change_files(source: str, version: int) -> list[str]:
    """The files the change feed of one upstream version is read from.

    A commit with `cdc` actions is read from its change files only; a commit without
    them (a plain append or whole-file delete) from its added and data-changing removed files.
    """
    cdc: list[str] = []
    data: list[str] = []
    for action in commit_actions(source, version):
        if "cdc" in action:
            cdc.append(action["cdc"]["path"])
        for kind in ("add", "remove"):
            if kind in action and action[kind].get("dataChange", True):
                data.append(action[kind]["path"])
    return [os.path.join(source, unquote(path)) for path in (cdc or data)]


def _check_change_files_available(source: str, watermark: int, end_version: int) -> None:
    for version in range(watermark + 1, end_version + 1):
        missing = [path for path in change_files(source, version) if not os.path.exists(path)]
        if missing:
            raise UpstreamError(
                f"the upstream's change files for version {version} are gone ({len(missing)} missing, "
                f"e.g. {os.path.relpath(missing[0], source)}): the upstream was vacuumed past the MV's "
                f"watermark {watermark}. Changes cannot be replayed; rebuild the MV with a new snapshot "
                "(delete the target and rerun the DAG), and keep delta.deletedFileRetentionDuration "
                "longer than the backfill."
            )


def _schema_diff(before: pa.Schema, after: pa.Schema) -> str:
    old = {field.name: field for field in before}
    new = {field.name: field for field in after}
    parts = [f"added {name}" for name in new if name not in old]
    parts += [f"dropped {name}" for name in old if name not in new]
    parts += [
        f"{name}: {old[name].type} -> {new[name].type}"
        for name in old
        if name in new and old[name] != new[name]
    ]
    return ", ".join(parts) or "field order or metadata changed"
