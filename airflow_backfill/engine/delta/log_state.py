"""A table's Delta log as this process read it: each commit parsed once, and the live files
of a version with their whole add actions (deletion vectors included).

Why: a round asks the same few log entries many questions (is the range readable, does
it hold change files, did it only append, what are its key bounds), and each question
used to read and parse the entries again; rounds that mark or look up rows by key need
each live file's deletion vector, which delta-rs' file listing does not give. A commit
entry never changes once written, so its parsed actions are kept (checked against the
entry's file status, which tells a table recreated at the same path); a version's live
files are the last checkpoint's plus the commits after it, reconciled as the protocol
says (a file is live under its path and its deletion vector's id), and a later version
is reached from a kept one by reading only the commits in between.

Classic checkpoints (one file, or several parts) are read; a table with only V2
checkpoints, or a log this cannot follow, answers None and the caller asks Delta.
"""

from __future__ import annotations

import decimal
import json
import logging
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any
from urllib.parse import unquote

from airflow_backfill.engine.delta.deletion_vectors import unique_id
from airflow_backfill.storage import files
from airflow_backfill.storage.uri import join

log = logging.getLogger(__name__)

_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10}))?\.parquet$")
_COMMITS_KEPT = 8192
"""Parsed commit entries kept per process (a few kB each)."""


@dataclass(frozen=True)
class LiveFile:
    """One live data file: its add action as the log holds it."""

    table_uri: str
    add: dict[str, Any]

    @property
    def path(self) -> str:
        return str(self.add["path"])

    @cached_property
    def uri(self) -> str:
        path = unquote(self.path)
        return path if "://" in path or path.startswith("/") else join(self.table_uri, path)

    @property
    def size(self) -> int:
        return int(self.add.get("size") or 0)

    @property
    def deletion_vector(self) -> dict[str, Any] | None:
        return self.add.get("deletionVector") or None

    @cached_property
    def stats(self) -> dict[str, Any]:
        """The file's statistics (`numRecords`, `minValues`, `maxValues`, `nullCount`, and
        `tightBounds`), {} when the log has none."""
        text = self.add.get("stats")
        return json.loads(text, parse_float=decimal.Decimal) if text else {}

    @property
    def records(self) -> int | None:
        """Rows the file holds physically (its vector's rows included)."""
        value = self.stats.get("numRecords")
        return None if value is None else int(value)

    @property
    def live_records(self) -> int | None:
        """Rows the file holds that its vector leaves live."""
        if self.records is None:
            return None
        vector = self.deletion_vector
        return self.records - (int(vector["cardinality"]) if vector else 0)


@dataclass(frozen=True)
class TableState:
    """The live files of one version, with its metadata and protocol actions."""

    uri: str
    version: int
    live: dict[tuple[str, str], dict[str, Any]]
    metadata: dict[str, Any]
    protocol: dict[str, Any]
    ending: tuple[int, ...] | None = None
    """The status of the commit file the version ends with (None: it ends at a checkpoint)."""
    _files: list[LiveFile] = field(default_factory=list, compare=False, repr=False)

    @property
    def files(self) -> list[LiveFile]:
        if not self._files and self.live:
            self._files.extend(LiveFile(self.uri, add) for add in self.live.values())
        return self._files

    @property
    def configuration(self) -> dict[str, str]:
        return dict(self.metadata.get("configuration") or {})

    @property
    def plain_layout(self) -> bool:
        """Neither partitioned nor with mapped column names: files hold the columns as named."""
        mapping = self.configuration.get("delta.columnMapping.mode", "none")
        return not self.metadata.get("partitionColumns") and mapping in ("none", None)

    @property
    def reader_features(self) -> set[str]:
        return set(self.protocol.get("readerFeatures") or ())


_lock = threading.Lock()
_commits: OrderedDict[tuple[str, int], tuple[tuple[int, ...] | None, list[dict[str, Any]]]] = OrderedDict()
_states: dict[str, TableState] = {}


def commit_file(uri: str, version: int) -> str:
    return join(uri, "_delta_log", f"{version:020d}.json")


def commit_entry(uri: str, version: int, identity: tuple[int, ...] | None = None) -> list[dict[str, Any]] | None:
    """The actions of commit `version`, parsed once per process; None when the entry is gone.
    `identity`: the entry's file status when the caller has it (a listing), else it is
    asked of the store."""
    read = _read_commit(uri, version, identity)
    return None if read is None else read[1]


def _read_commit(uri: str, version: int, identity: tuple[int, ...] | None = None
                 ) -> tuple[tuple[int, ...], list[dict[str, Any]]] | None:
    if identity is None:
        identity = files.identity(commit_file(uri, version))
        if identity is None:
            return None
    key = (uri, version)
    with _lock:
        kept = _commits.get(key)
        if kept is not None and kept[0] == identity:
            _commits.move_to_end(key)
            return identity, kept[1]
    text = files.read_text(commit_file(uri, version))
    if text is None:
        return None
    actions = [json.loads(line) for line in text.splitlines() if line.strip()]
    with _lock:
        _commits[key] = (identity, actions)
        while len(_commits) > _COMMITS_KEPT:
            _commits.popitem(last=False)
    return identity, actions


def table_state(uri: str, version: int | None = None) -> TableState | None:
    """The table's live files at `version` (its latest when None); None when the log is not
    one this module follows (see the module's text) or `version` cannot be rebuilt."""
    with _lock:
        kept = _states.get(uri)
    if kept is not None and not _still_the_same_table(uri, kept):
        kept = None
    if kept is not None and version is not None and kept.version == version:
        return kept
    start = kept if kept is not None and (version is None or kept.version < version) else None
    state = _advanced(uri, start, version) if start is not None else _loaded(uri, version)
    if state is not None and (kept is None or state.version >= kept.version):
        with _lock:
            _states[uri] = state
    return state


def _still_the_same_table(uri: str, state: TableState) -> bool:
    """Whether the commit the kept state ends with is still the one read (not a table
    recreated at the same path)."""
    return state.ending is not None and files.identity(commit_file(uri, state.version)) == state.ending


def _advanced(uri: str, state: TableState, version: int | None) -> TableState | None:
    """`state` brought forward to `version` (as far as commits exist when None)."""
    live, metadata, protocol = dict(state.live), state.metadata, state.protocol
    current, ending = state.version, state.ending
    while version is None or current < version:
        read = _read_commit(uri, current + 1)
        if read is None:
            if version is not None:
                return None
            break
        current += 1
        ending, actions = read
        metadata, protocol = _apply(live, actions, metadata, protocol)
    if current == state.version:
        return state
    return TableState(uri, current, live, metadata, protocol, ending)


def _loaded(uri: str, version: int | None) -> TableState | None:
    """The state at `version` read from the last checkpoint at or before it and the commits
    after that checkpoint."""
    names = files.list_names(join(uri, "_delta_log"))
    commits = sorted(int(name[:20]) for name in names if name.endswith(".json") and name[:20].isdigit())
    if not commits and not any(_CHECKPOINT.match(name) for name in names):
        return None
    latest = max(commits, default=-1)
    target = latest if version is None else version
    checkpoints: dict[int, list[str]] = {}
    for name in names:
        match = _CHECKPOINT.match(name)
        if match and int(match.group(1)) <= target:
            checkpoints.setdefault(int(match.group(1)), []).append(name)
    start_at, parts = _whole_checkpoint(checkpoints)
    if start_at is None and any(".checkpoint." in name for name in names) and 0 not in commits:
        return None  # only checkpoints this module does not read (V2), or none whole
    live: dict[tuple[str, str], dict[str, Any]] = {}
    metadata: dict[str, Any] = {}
    protocol: dict[str, Any] = {}
    if start_at is not None:
        loaded = _read_checkpoint(uri, parts)
        if loaded is None:
            return None
        live, metadata, protocol = loaded
    current = -1 if start_at is None else start_at
    state = TableState(uri, current, live, metadata, protocol, files.identity(commit_file(uri, current)))
    return _advanced(uri, state, target) if target > current else state


def _whole_checkpoint(checkpoints: dict[int, list[str]]) -> tuple[int | None, list[str]]:
    """The newest checkpoint with all its parts present."""
    for version in sorted(checkpoints, reverse=True):
        names = sorted(checkpoints[version])
        matches = [_CHECKPOINT.match(name) for name in names]
        counts = {int(m.group(3)) for m in matches if m and m.group(3)}
        if not counts and len(names) == 1:
            return version, names
        if len(counts) == 1 and len(names) == counts.pop():
            return version, names
    return None, []


def _read_checkpoint(uri: str, parts: list[str]) -> tuple[dict[tuple[str, str], dict[str, Any]], dict[str, Any],
                                                          dict[str, Any]] | None:
    import pyarrow.compute as pc

    live: dict[tuple[str, str], dict[str, Any]] = {}
    metadata: dict[str, Any] = {}
    protocol: dict[str, Any] = {}
    for name in parts:
        path = join(uri, "_delta_log", name)
        available = set(files.parquet_metadata(path).schema.to_arrow_schema().names)
        if "add" not in available:
            return None
        wanted = [column for column in ("add", "metaData", "protocol") if column in available]
        table = files.read_parquet_columns(path, wanted)
        adds = table.column("add")
        for add in adds.filter(pc.is_valid(adds)).to_pylist():
            add = _plain_add(add)
            live[(add["path"], unique_id(add.get("deletionVector")))] = add
        for column, target in (("metaData", metadata), ("protocol", protocol)):
            if column in table.column_names:
                values = table.column(column)
                for value in values.filter(pc.is_valid(values)).to_pylist():
                    target.update(_plain_struct(value))
    return live, metadata, protocol


def _plain_add(add: dict[str, Any]) -> dict[str, Any]:
    """An add action read from a checkpoint, as its JSON form has it: maps as objects, no
    absent fields, statistics as JSON text."""
    plain = _plain_struct(add)
    parsed = plain.pop("stats_parsed", None)
    if not plain.get("stats") and parsed:
        plain["stats"] = json.dumps(parsed, default=str)
    return plain


def _plain_struct(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _plain_struct(item) for key, item in value.items() if item is not None}
    if isinstance(value, list) and all(isinstance(item, tuple) and len(item) == 2 for item in value):
        return {key: item for key, item in value}  # a map, as pyarrow lists it
    return value


def _apply(live: dict[tuple[str, str], dict[str, Any]], actions: list[dict[str, Any]], metadata: dict[str, Any],
           protocol: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """One commit's actions applied to `live`, whatever their order in the entry (a file
    rewritten with a new vector is removed under its old vector's id and added under the
    new one's)."""
    for action in actions:
        if "remove" in action:
            removed = action["remove"]
            live.pop((removed["path"], unique_id(removed.get("deletionVector"))), None)
    for action in actions:
        if "add" in action:
            added = action["add"]
            live[(added["path"], unique_id(added.get("deletionVector")))] = added
        elif "metaData" in action:
            metadata = action["metaData"]
        elif "protocol" in action:
            protocol = action["protocol"]
    return metadata, protocol
