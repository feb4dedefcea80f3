"""Reads of Delta logs through delta-rs: versions, watermarks, table checks.

Nothing here starts Spark, so the Airflow hook, sensor and trigger can use it from a
scheduler or triggerer process.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from airflow_backfill.engine.delta.log_state import commit_entry
from airflow_backfill.engine.internals import CommitFile, IsNewest
from airflow_backfill.exceptions import TargetError, UpstreamError
from airflow_backfill.storage import files
from airflow_backfill.storage.failures import names_failures
from airflow_backfill.storage.s3_settings import storage_options
from airflow_backfill.storage.uri import join

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

CDF_PROPERTY = "delta.enableChangeDataFeed"
CHECKPOINT_INTERVAL_PROPERTY = "delta.checkpointInterval"
DELETION_VECTORS_PROPERTY = "delta.enableDeletionVectors"
UPSTREAM_CHECKPOINT_INTERVAL = "10"
"""What the project's own upstream writers (simulator, TPC-H) set: a Delta reader rebuilds a
table's state from its last checkpoint plus the commits after it, so a log that is never
checkpointed makes every Spark read of it slower as it grows (Spark writers checkpoint
every 10 commits by default; delta-rs only when the table asks)."""
METADATA_PREFIX = "airflow_backfill."
log = logging.getLogger(__name__)
_loaded = threading.local()
_LOG_FILE = re.compile(r"^(\d{20})\.(?:json|checkpoint(?:\.\d+\.\d+)?\.parquet)$")
_UNSUPPORTED_READER_FEATURES = {"columnMapping": "column mapping"}


@dataclass(frozen=True)
class UpstreamInfo:
    """What the phases need to know about the upstream at one version."""

    uri: str
    version: int
    schema: pa.Schema
    deletion_vectors: bool = False
    """True when the table may mark rows deleted outside its data files (then it is read
    through Delta, never as plain Parquet files)."""


@names_failures()
def delta_table(uri: str, version: int | None = None) -> DeltaTable:
    """delta-rs' view of the table at `uri` (local or on S3, with this process's settings)."""
    return DeltaTable(uri, version=version, storage_options=storage_options(uri))


@names_failures()
def table_exists(uri: str) -> bool:
    """True when `uri` holds a Delta log (cheap: no table load)."""
    return files.is_directory(join(uri, "_delta_log")) and DeltaTable.is_deltatable(
        uri, storage_options=storage_options(uri))


@names_failures()
def load_table(uri: str) -> DeltaTable:
    """The Delta table at `uri` as of its latest version.

    Loaded once per thread, then brought up to date by reading only the commits since
    (rounds, polls and checks reload the same few tables over and over, and a full load
    of a large log costs tens of milliseconds). A table recreated at the same path is
    recognised by its commit file having changed, and loaded afresh. While no commit
    followed the one loaded (no next commit file), the table is returned as it is: the
    update would list the log folder (milliseconds, growing with the log) to find nothing.
    """
    cache = _table_cache()
    cached = _still_loaded(uri)
    if cached is not None:
        table, version = cached
        if not files.exists(_commit_file(uri, version + 1)):
            return table
        try:
            table.update_incremental()
        except Exception:  # e.g. the commits since were cleaned from the log: load afresh
            log.debug("reloading %s: its log cannot be followed from version %s", uri, version)
        else:
            cache[uri] = (table, table.version(), _commit_identity(uri, table.version()))
            return table
    table = delta_table(uri)
    cache[uri] = (table, table.version(), _commit_identity(uri, table.version()))
    return table


def table_at(uri: str, version: int | None = None) -> DeltaTable:
    """The table as of `version` (default the latest): the table this thread loaded last
    (`load_table`) when it is that version, else a load of that version. Why: a round asks
    for its upstream and MV at the version it just read or wrote, several times, and each
    load of a version reads the log from its last checkpoint (milliseconds each)."""
    if version is None:
        return load_table(uri)
    cached = _still_loaded(uri)
    if cached is not None and cached[1] == version:
        return cached[0]
    return delta_table(uri, version)


def _still_loaded(uri: str) -> tuple[DeltaTable, int] | None:
    """The table this thread loaded last at `uri` and its version, while the commit file of
    that version is still the one loaded (not a table recreated at the same path)."""
    cached = _table_cache().get(uri)
    if cached is None:
        return None
    table, version, identity = cached
    if identity is None or _commit_identity(uri, version) != identity:
        return None
    return table, version


def _table_cache() -> dict[str, tuple[DeltaTable, int, tuple[int, ...] | None]]:
    """This thread's loaded tables by URI: (table, its version, its commit file's identity)."""
    cache: dict[str, tuple[DeltaTable, int, tuple[int, ...] | None]] = _loaded.__dict__.setdefault("tables", {})
    return cache


def _commit_file(uri: str, version: int) -> str:
    return join(uri, "_delta_log", f"{version:020d}.json")


def still_newest(uri: str) -> IsNewest:
    """Whether a commit file of the table at `uri` is still its newest: the file at its
    version is that one (same size and modification time), and no commit followed it. A
    commit writes its file whole under its final name, so these two file statuses tell
    what a listing of the log would."""
    def is_newest(commit: CommitFile) -> bool:
        return (files.size_and_modified_ms(_commit_file(uri, commit.version)) == (commit.size, commit.modified_ms)
                and not files.exists(_commit_file(uri, commit.version + 1)))

    return is_newest


def _commit_identity(uri: str, version: int) -> tuple[int, ...] | None:
    """What tells a commit file apart from another one written later at the same path."""
    return files.identity(_commit_file(uri, version))


def open_upstream(uri: str, version: int | None = None) -> DeltaTable:
    """Load the upstream, turning delta-rs' errors into ones that say what happened and what
    to do: a store that cannot be reached or refuses the credentials, or a local path this
    process may not read (a `ServiceError`, from `names_failures`), a version the log can
    no longer rebuild or that was never committed (an `UpstreamError` saying which)."""
    if not table_exists(uri):
        raise UpstreamError(
            f"upstream {uri} is not a Delta table (no _delta_log); check the job's `source`."
        )
    try:
        return table_at(uri, version)
    except DeltaError as error:  # TableNotFoundError too: a version whose part of the log is gone
        if version is not None:
            raise _version_unreadable(uri, version, error) from error
        if isinstance(error, TableNotFoundError):
            raise UpstreamError(f"upstream {uri} is not a Delta table; check the job's `source`.") from None
        raise


def _version_unreadable(uri: str, version: int, error: Exception) -> UpstreamError:
    """Why delta-rs could not load `version` of the table, told from its log's file names."""
    names = files.list_names(join(uri, "_delta_log"))
    commits = {int(name[:20]) for name in names if _LOG_FILE.match(name) and name.endswith(".json")}
    checkpoints = {int(name[:20]) for name in names if _LOG_FILE.match(name) and ".checkpoint" in name}
    latest = max(commits | checkpoints, default=-1)
    said = f" (delta-rs: {error})"
    if version > latest:
        return UpstreamError(
            f"upstream {uri} has no version {version}: its latest is {latest}. That epoch was never committed "
            "there, or the table was recreated at this path since; if it was, rebuild the MV with a new "
            f"snapshot (delete the target and rerun the DAG).{said}"
        )
    if not _rebuildable(version, commits, checkpoints):
        starts = checkpoints | ({0} if 0 in commits else set())
        kept = f"its log keeps versions {min(starts)}..{latest}" if starts else "its log keeps no complete version"
        return UpstreamError(
            f"upstream {uri} can no longer be read as of version {version}: {kept}, older entries expired "
            "(delta.logRetentionDuration) or were cleaned up. Changes since then cannot be replayed; rebuild "
            f"the MV with a new snapshot (delete the target and rerun the DAG).{said}"
        )
    return UpstreamError(
        f"upstream {uri} cannot be read as of version {version} although its log has the entries for it: "
        f"delta-rs cannot rebuild that version from them. Check {join(uri, '_delta_log')} up to version "
        f"{version} for a damaged entry or checkpoint.{said}"
    )


def _rebuildable(version: int, commits: set[int], checkpoints: set[int]) -> bool:
    """Whether a reader can rebuild `version`: a checkpoint at or before it with every commit
    after that checkpoint up to it, or every commit from the first."""
    while version >= 0:
        if version in checkpoints:
            return True
        if version not in commits:
            return False
        version -= 1
    return True


@names_failures()
def latest_version(uri: str) -> int:
    """The upstream's newest committed version (its latest epoch).

    Read from the log's file names (a commit `N.json` or checkpoint `N.checkpoint...`
    exists once version N is committed): rounds, polls and sensors ask this often, and a
    listing costs far less than loading the table.
    """
    if not table_exists(uri):
        return open_upstream(uri).version()  # raises the error that says what is wrong
    versions = [int(match.group(1)) for name in files.list_names(join(uri, "_delta_log"))
                if (match := _LOG_FILE.match(name))]
    return max(versions) if versions else open_upstream(uri).version()


UNCHECKPOINTED_COMMITS_WARNING = 100


@names_failures()
def warn_if_rarely_checkpointed(uri: str) -> int:
    """Warn when the table's log has many commits after its last checkpoint; returns them.

    Spark rebuilds a table's state from the last checkpoint plus every commit after it,
    for every read of a new version: an upstream written by a tool that never checkpoints
    makes each catch-up round and forward commit slower as its log grows.
    """
    names = files.list_names(join(uri, "_delta_log"))
    checkpoints = [int(name[:20]) for name in names if ".checkpoint" in name and name[:20].isdigit()]
    commits = [int(match.group(1)) for name in names if (match := _LOG_FILE.match(name)) and name.endswith(".json")]
    since = max(commits, default=-1) - max(checkpoints, default=-1)
    if since > UNCHECKPOINTED_COMMITS_WARNING:
        log.warning(
            "%s has %s commits after its last checkpoint: Spark replays all of them to read it, so rounds "
            "slow down as the log grows. Set %s (e.g. 10) on the table or checkpoint it regularly.",
            uri, since, CHECKPOINT_INTERVAL_PROPERTY,
        )
    return since


@names_failures()
def commit_actions(uri: str, version: int) -> list[dict[str, Any]]:
    """The actions of commit `version` from its log entry (parsed once per process,
    `log_state.commit_entry`); [] when the entry is gone."""
    return commit_entry(uri, version) or []


HISTORY_ATTEMPTS = 20
"""Reads of a table's history `commit_history` tries before it gives up on a table that
gains a commit during each of them."""


@names_failures()
def commit_history(uri: str, limit: int | None = None) -> list[dict[str, Any]]:
    """The table's latest `limit` commits (all when None), newest first, each with its true
    `version`.

    delta-rs' `history()` lists the commits in storage when it is called but numbers them
    down from the version the table was loaded at: a commit landing between the load and
    the listing shifts every number by one, and a position read from it would pair one
    commit's metadata with the previous version's data. A listing is kept only when no
    commit newer than the loaded version exists after it (commit files only ever appear),
    else the table is loaded again.
    """
    for _ in range(HISTORY_ATTEMPTS):
        table = delta_table(uri)
        history = table.history(limit=limit)
        if not files.exists(join(uri, "_delta_log", f"{table.version() + 1:020d}.json")):
            return history
    raise UpstreamError(
        f"{uri} gained a commit during each of {HISTORY_ATTEMPTS} reads of its history; "
        "retry, or check which writer commits to it that often."
    )


def commit_timestamp(uri: str, version: int) -> int | None:
    """When `version` was committed (ms since the epoch, as its commitInfo records it)."""
    for action in commit_actions(uri, version):
        if "commitInfo" in action and "timestamp" in action["commitInfo"]:
            return int(action["commitInfo"]["timestamp"])
    return None


def keeps_change_feed(configuration: Mapping[str, Any]) -> bool:
    """Whether a table of these properties keeps a change feed (`delta.enableChangeDataFeed`)."""
    return str(configuration.get(CDF_PROPERTY, "false")).lower() == "true"


def check_upstream(uri: str, version: int | None = None, *, key: Collection[str] = ()) -> UpstreamInfo:
    """Validate that the upstream can be backfilled from and describe it at `version`.

    Refused: a missing table, a table without the Change Data Feed (catch-up and forward
    read it), partitioned tables, column mapping (physical column names), and a `key`
    column the upstream does not have as written (`refuse_key_not_held`).
    """
    table = open_upstream(uri, version)
    configuration = table.metadata().configuration
    if not keeps_change_feed(configuration):
        raise UpstreamError(
            f"upstream {uri} does not have the Change Data Feed enabled; enable it with "
            f"ALTER TABLE ... SET TBLPROPERTIES ('{CDF_PROPERTY}' = 'true') "
            "(delta-rs: DeltaTable.alter.set_table_properties) and start the backfill after that version."
        )
    features = set(table.protocol().reader_features or [])
    for feature, label in _UNSUPPORTED_READER_FEATURES.items():
        if feature in features:
            raise UpstreamError(
                f"upstream {uri} uses {label} (reader feature {feature!r}), which this version "
                "does not read. Rewrite the table without that feature."
            )
    if configuration.get("delta.columnMapping.mode", "none") not in ("none", None):
        raise UpstreamError(
            f"upstream {uri} uses column mapping; rewrite the table without column mapping."
        )
    if table.metadata().partition_columns:
        raise UpstreamError(
            f"upstream {uri} is partitioned by {table.metadata().partition_columns}; "
            "partitioned upstreams are not supported yet. Use an unpartitioned copy."
        )
    schema = arrow_schema(table)
    refuse_key_not_held(uri, schema.names, key)
    return UpstreamInfo(uri=uri, version=table.version(), schema=schema,
                        deletion_vectors="deletionVectors" in features)


def refuse_key_not_held(uri: str, columns: Collection[str], key: Collection[str]) -> None:
    """Refuse a primary-key column the upstream does not hold, or holds spelled in another
    case. Spark matches names whatever their case, so such a key would pass the snapshot;
    the rounds read changes as Arrow rows, which match names exactly, and would all fail."""
    by_lower = {name.lower(): name for name in columns}
    for column in key:
        if column in columns:
            continue
        spelled = by_lower.get(column.lower())
        if spelled is not None:
            fixed = ", ".join(by_lower.get(c.lower(), c) for c in key)
            raise UpstreamError(
                f"primary_key {column!r}: upstream {uri} spells this column {spelled!r}; write it so "
                f"in the job's primary_key (primary_key: [{fixed}])."
            )
        raise UpstreamError(
            f"primary_key {column!r} is not a column of upstream {uri} (its columns: {', '.join(columns)}); "
            "name the upstream's key columns in the job's primary_key."
        )


def arrow_schema(table: DeltaTable) -> pa.Schema:
    """The table's schema as a pyarrow schema (delta-rs 1.x returns arro3 objects)."""
    return pa.schema(table.schema().to_arrow())


def column_names(uri: str, lowered: Collection[str] | None = None) -> list[str]:
    """The table's latest column names, in order, from its log; with `lowered`, only those
    whose lower-case name it holds (a query's references, which Spark matches whatever
    their case)."""
    names = arrow_schema(load_table(uri)).names
    return list(names) if lowered is None else [name for name in names if name.lower() in lowered]


def spark_schema(table: DeltaTable) -> StructType:
    """The table's schema as Spark types, from its log: Delta writes a schema as Spark's
    own JSON, so this is the schema Spark reads, without the JVM loading the table."""
    from pyspark.sql.types import StructType

    return StructType.fromJson(json.loads(table.schema().to_json()))


def snapshot_app_id(app_id: str) -> str:
    """The app transaction a snapshot's chunk commits carry (version = chunks committed)."""
    return f"{app_id}/snapshot"


def read_watermark(target: str, app_id: str) -> int | None:
    """The upstream epoch the MV reflects, from its app transaction; None if not created.

    A table whose only transaction is the snapshot's chunks is an MV being created: it
    has no watermark yet, and nothing may read it as the MV.
    """
    if not table_exists(target):
        return None
    table = load_table(target)
    version = table.transaction_version(app_id)
    if version is None and table.transaction_version(snapshot_app_id(app_id)) is not None:
        return None
    if version is None:
        raise TargetError(
            f"target {target} is a Delta table that was not built by this job ({app_id}); "
            "choose another target path or delete that table."
        )
    return int(version)


def written_by_a_job(uri: str) -> bool:
    """Whether the table's newest commit was an MV commit of this engine (it names its job)."""
    history = commit_history(uri, limit=1)
    return bool(history) and "job" in commit_metadata(history[0])


def commit_metadata(entry: dict[str, Any]) -> dict[str, Any]:
    """The `airflow_backfill.*` fields of one commit (an entry of `DeltaTable.history()`),
    without the prefix.

    delta-spark records them as JSON in the commit's `userMetadata`; commits made before
    it (through delta-rs) carry them as top-level commitInfo keys. Both are read.
    """
    fields = {key: value for key, value in entry.items() if key.startswith(METADATA_PREFIX)}
    user_metadata = entry.get("userMetadata")
    if isinstance(user_metadata, str) and user_metadata.startswith("{"):
        try:
            parsed = json.loads(user_metadata)
        except ValueError:
            parsed = {}
        if isinstance(parsed, dict):
            fields.update({key: value for key, value in parsed.items() if key.startswith(METADATA_PREFIX)})
    return {key[len(METADATA_PREFIX):]: value for key, value in fields.items()}


def rows_written(uri: str) -> int:
    """Rows the table's latest commit wrote (its operation metrics)."""
    history = commit_history(uri, limit=1)
    metrics = history[0].get("operationMetrics", {}) if history else {}
    return int(metrics.get("numOutputRows", 0))


def last_commit_metadata(target: str) -> dict[str, Any]:
    """The `airflow_backfill.*` metadata of the MV's latest commit ({} when none)."""
    if not table_exists(target):
        return {}
    history = commit_history(target, limit=1)
    return commit_metadata(history[0]) if history else {}
