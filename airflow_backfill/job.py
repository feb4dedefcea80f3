"""The declaration of a backfill job: what to build, from what, and how fast.

A job comes from a YAML job file (`load_job`) or from Python (`BackfillJob(...)`);
both paths run the same validation, so a bad declaration fails at DAG-parse time or on
load, before any Spark work starts.
"""

from __future__ import annotations

import json
import os
import re
import string
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, cast

import yaml

from airflow_backfill.config import setting
from airflow_backfill.exceptions import BackfillConfigError

MAX_PARALLELISM = 1024
"""Upper bound for both parallelisms: far above any single cluster slot count, low
enough to catch a typo such as an extra zero."""

_NAME_PATTERN = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,127}$")


def validate_whole_number(name: str, value: Any, upper: int) -> int:
    """A whole number from 1 to `upper` (a setting a person types: the job's, an operator's)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise BackfillConfigError(
            f"{name} must be an integer between 1 and {upper}, got {value!r}; "
            f"set {name} to a whole number such as 2."
        )
    if not 1 <= value <= upper:
        raise BackfillConfigError(
            f"{name} must be between 1 and {upper}, got {value}; pick a value in that range."
        )
    return value


def validate_seconds(name: str, value: Any) -> float:
    """A duration in (0, 3600] seconds, for the job's and the operators' polling settings."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BackfillConfigError(f"{name} must be a number of seconds, got {value!r}.")
    if not 0 < value <= 3600:
        raise BackfillConfigError(f"{name} must be in (0, 3600] seconds, got {value}.")
    return value


def validate_parallelism(name: str, value: Any) -> int:
    """Validate a (backfill) parallelism; shared by the job, --conf overrides and the CLI."""
    return validate_whole_number(name, value, MAX_PARALLELISM)


def validate_rate_limit(value: Any) -> int | None:
    """Validate a rows-per-second cap; None means unlimited."""
    if value is None:
        return None
    return validate_whole_number("rate_limit", value, 10**12)


def validate_optional_cap(name: str, value: Any) -> int | None:
    """Validate an optional cap: epochs or change bytes of one catch-up round, the largest
    file maintenance writes; None means no cap (or the default)."""
    if value is None:
        return None
    return validate_whole_number(name, value, 10**15)


ROUND_PLANS = ("auto", "incremental", "recompute", "merge")


def validate_round_plan(value: Any) -> str:
    """Validate how rounds apply their changes (see `BackfillJob.round_plan`)."""
    if value not in ROUND_PLANS:
        raise BackfillConfigError(
            f"round_plan must be one of {', '.join(ROUND_PLANS)}, got {value!r}; use auto unless you "
            "want to force incremental rounds, whole recomputes, or merges (an MV feed read by delta-rs)."
        )
    return str(value)


DEFAULT_MAX_STALLED_ROUNDS = 3
MAX_STALLED_ROUNDS_LIMIT = 1000
"""Upper bound for max_stalled_rounds: a lag that has not reached a new low for this long never will."""


def validate_max_stalled_rounds(value: Any) -> int:
    """Validate the rounds without a new lowest lag after which catch-up hands over to forward."""
    return validate_whole_number("max_stalled_rounds", value, MAX_STALLED_ROUNDS_LIMIT)


def validate_lag_threshold(value: Any) -> int:
    """Validate the number of pending epochs at which catch-up hands over to forward."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BackfillConfigError(
            f"lag_threshold must be a non-negative integer (pending epochs), got {value!r}."
        )
    return value


HOME_VARIABLE = "AIRFLOW_BACKFILL_HOME"
DEFAULT_HOME = "~/airflow_backfill"


def backfill_home() -> str:
    """Where the example jobs keep their tables: the `[airflow_backfill] home` setting
    ($AIRFLOW_BACKFILL_HOME overrides it; default ~/airflow_backfill)."""
    return os.path.expanduser(setting("home") or DEFAULT_HOME)


def expand_variables(value: str) -> str:
    """Expand `~` and `${VARS}` (AIRFLOW_BACKFILL_HOME has a default); refuse unset variables."""
    variables = {**os.environ, HOME_VARIABLE: backfill_home()}
    expanded = os.path.expanduser(string.Template(value).safe_substitute(variables))
    if "$" in expanded:
        raise BackfillConfigError(
            f"{value!r} uses an environment variable that is not set; export it or write the path out."
        )
    return expanded



OBJECT_STORE_URI = re.compile(r"^s3a?://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^?#]*)?$")


def normalize_table_uri(name: str, value: Any) -> str:
    """An absolute local path (`~` and `${VARS}` expanded) or an `s3://bucket/prefix` URI."""
    if not isinstance(value, str) or not value.strip():
        raise BackfillConfigError(f"{name} must be a Delta table path or URI, got {value!r}.")
    value = expand_variables(value.strip())
    if value.startswith("file://"):
        value = value[len("file://") :]
    if value.startswith(("s3://", "s3a://")):
        if not OBJECT_STORE_URI.match(value) or value.rstrip("/").count("/") < 3:
            raise BackfillConfigError(
                f"{name}={value!r} is not a table URI on S3; write s3://bucket/path/to/table "
                "(a lowercase bucket name and a path below it)."
            )
        return value.rstrip("/")
    if "://" in value:
        raise BackfillConfigError(
            f"{name}={value!r}: Delta tables are supported on local paths (a path or file://) and "
            "on S3-compatible stores (s3://bucket/path); copy the table to one of those."
        )
    return os.path.abspath(value)


MAX_JOINED_UPSTREAMS = 4
"""The most upstreams one join MV may read: each round applies one delta term per
upstream, each joining its changes with the other upstreams."""

_UPSTREAM_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
SINGLE_UPSTREAM_NAME = "source"
"""The name the query of a one-upstream job reads its upstream by."""


@dataclass(frozen=True)
class Upstream:
    """One upstream table of a job: the name its query reads it by, where it is, its key."""

    name: str
    table: str
    """Delta table path or URI (normalised like `source`)."""
    primary_key: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class BackfillJob:
    """One materialized view over one upstream Delta table (`source`) or over a join of
    several (`sources`)."""

    name: str
    """Identifies the job; the MV's app transaction id is `airflow_backfill/<name>`."""
    source: str = ""
    """Upstream Delta table (path, file:// or s3:// URI). It must have the Change Data Feed on.
    Required unless `sources` names several upstreams."""
    target: str
    """The MV's Delta table (path, file:// or s3:// URI). Created by the snapshot phase."""
    query: str
    """Spark SQL over the table name `source` (or the names of `sources`) that defines the MV."""
    primary_key: tuple[str, ...] = ()
    """Upstream primary-key columns; the query must select each of them unchanged. Required
    with `source`; with `sources` each upstream declares its own."""
    sources: Mapping[str, Any] | tuple[Upstream, ...] = ()
    """A join's upstreams, two to four: `{name: {table: <path or URI>, primary_key: [...]}}`;
    the query reads each by its name (docs/joins.md). Kept as a tuple of `Upstream`."""
    backfill_parallelism: int = 2
    """Spark parallelism of the snapshot and catch-up phases."""
    parallelism: int = 1
    """Spark parallelism of the forward phase (steady state)."""
    lag_threshold: int = 0
    """Pending upstream epochs at or under which catch-up hands over to forward."""
    rate_limit: int | None = None
    """Rows per second cap on snapshot and catch-up reads; None for no cap."""
    poll_interval: float = 1.0
    """Seconds between upstream polls in the forward phase and the caught-up sensor."""
    max_catch_up_rounds: int = 100
    """Catch-up rounds after which the job hands over to forward even if still lagging."""
    max_stalled_rounds: int = DEFAULT_MAX_STALLED_ROUNDS
    """Catch-up rounds in a row whose starting lag was no new low after which catch-up hands
    over to forward with a warning (the upstream commits as fast as a round applies)."""
    max_round_epochs: int | None = None
    """Upstream epochs one catch-up round applies at most (None: every epoch pending at its
    start). A long backlog then becomes several bounded commits instead of one large one."""
    max_round_bytes: int | None = None
    """Change-file bytes one catch-up round reads at most (always at least one epoch; None:
    no cap). Bounds a round's memory and time when single epochs are large."""
    round_alignment: int | None = None
    """Catch-up and forward rounds end at a multiple of this many upstream epochs when their
    range holds one (None: at the newest pending epoch). MVs over the same upstream then
    commit at the same epochs, so `airflow-backfill consistent` finds one they share while
    the upstream's writers never pause (docs/consistent-reads.md); costs at most one more
    round each time a range crosses a multiple. A join aligns each of its upstreams."""
    verify_primary_key: bool = True
    """Prove in the snapshot that the primary key is unique in the query's output before
    the MV is created, in rounds applied as appends that the added rows repeat no key, and
    in rounds read from the change feed that no key is held twice, as the feed or the MV
    shows it (a repeated key is refused, naming it, before anything is committed). The
    proof is a shuffle of the key columns; set False only when the upstream guarantees its
    key (e.g. it is another job's MV keyed the same way): a duplicate key then goes
    undetected, appended twice or netted to one row."""
    round_plan: str = "auto"
    """How catch-up and forward rounds apply their changes: `auto` takes the way with the
    cheapest estimate, recomputing the whole MV when that is cheaper than applying the
    changes; `incremental` never recomputes; `recompute` always does; `merge` writes the MV
    only by MERGE or append, whose change feed delta-rs reads too (docs/round-plans.md).
    A join decides before it reads its feeds: it recomputes the join when that beats the
    least its round would cost (estimated from its snapshot and its earlier rounds)."""
    aws_conn_id: str | None = None
    """Airflow connection (the Amazon provider's `aws` type: keys, region, endpoint) for
    tables on S3. Its credentials reach spark-submit as environment variables only."""
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """Free-form user metadata, kept but not interpreted."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME_PATTERN.match(self.name):
            raise BackfillConfigError(
                f"name must start with a letter and use only letters, digits, '_', '.' or '-' "
                f"(at most 128 characters), got {self.name!r}."
            )
        object.__setattr__(self, "target", normalize_table_uri("target", self.target))
        if self.sources != ():  # an empty mapping is refused as naming no upstream
            self._validate_join_upstreams()
        else:
            object.__setattr__(self, "source", normalize_table_uri("source", self.source))
            if self.source == self.target:
                raise BackfillConfigError(
                    f"source and target are the same table ({self.source}); the MV needs its own path."
                )
            object.__setattr__(self, "primary_key", _primary_key(self.primary_key))
        if not isinstance(self.query, str) or not self.query.strip():
            raise BackfillConfigError("query must be a non-empty Spark SQL SELECT over `source`.")
        validate_parallelism("backfill_parallelism", self.backfill_parallelism)
        validate_parallelism("parallelism", self.parallelism)
        validate_lag_threshold(self.lag_threshold)
        validate_rate_limit(self.rate_limit)
        validate_seconds("poll_interval", self.poll_interval)
        validate_whole_number("max_catch_up_rounds", self.max_catch_up_rounds, 1_000_000)
        validate_max_stalled_rounds(self.max_stalled_rounds)
        validate_optional_cap("max_round_epochs", self.max_round_epochs)
        validate_optional_cap("max_round_bytes", self.max_round_bytes)
        validate_optional_cap("round_alignment", self.round_alignment)
        if self.aws_conn_id is not None and (not isinstance(self.aws_conn_id, str) or not self.aws_conn_id.strip()):
            raise BackfillConfigError(f"aws_conn_id must be an Airflow connection id, got {self.aws_conn_id!r}.")
        validate_round_plan(self.round_plan)
        if not isinstance(self.verify_primary_key, bool):
            raise BackfillConfigError(
                f"verify_primary_key must be true or false, got {self.verify_primary_key!r}."
            )
        self._check_query()

    def _check_query(self) -> None:
        """Refuse a query the engine cannot maintain when the job loads (in the DAG processor,
        `airflow-backfill check`), not when its first task runs. Checks that need the
        upstream's schema or change feed wait for `pin_epoch`."""
        # The query parser loads with the first job, not with this module (provider discovery imports it).
        from airflow_backfill.engine.planning.join_query import check_join_query
        from airflow_backfill.engine.planning.query import plan_query

        if self.is_join:
            check_join_query(self.query, tuple(upstream.name for upstream in self.upstreams))
        else:
            plan_query(self.query, self.primary_key)

    def _validate_join_upstreams(self) -> None:
        if self.source or self.primary_key:
            given = "source" if self.source else "primary_key"
            raise BackfillConfigError(
                f"a job with `sources` (a join) takes no top-level `{given}`: give each upstream its "
                "table and primary_key under `sources`, or use `source` and `primary_key` for one upstream."
            )
        upstreams = _upstreams(self.sources)
        for upstream in upstreams:
            if upstream.table == self.target:
                raise BackfillConfigError(
                    f"upstream {upstream.name} and target are the same table ({self.target}); the MV "
                    "needs its own path."
                )
        object.__setattr__(self, "sources", upstreams)

    @property
    def is_join(self) -> bool:
        """True when the MV reads several upstreams (`sources`)."""
        return bool(self.sources)

    @property
    def upstreams(self) -> tuple[Upstream, ...]:
        """Every upstream the MV reads, in declaration order (one, named `source`, without `sources`)."""
        if self.sources:
            return cast(tuple[Upstream, ...], self.sources)
        return (Upstream(SINGLE_UPSTREAM_NAME, self.source, self.primary_key),)

    @property
    def app_id(self) -> str:
        """The Delta app transaction id that carries the MV's watermark."""
        return f"airflow_backfill/{self.name}"

    @classmethod
    def from_mapping(cls, data: Any, *, origin: str = "job") -> BackfillJob:
        """Build a job from a mapping, rejecting unknown and missing keys by name."""
        if not isinstance(data, dict):
            raise BackfillConfigError(f"{origin}: expected a mapping of job fields, got {type(data).__name__}.")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise BackfillConfigError(
                f"{origin}: unknown field(s) {', '.join(unknown)}; valid fields are {', '.join(sorted(known))}."
            )
        one_upstream = "sources" not in data
        required = [f.name for f in fields(cls) if (f.default is MISSING and f.default_factory is MISSING)
                    or (one_upstream and f.name in ("source", "primary_key"))]
        missing = [name for name in required if name not in data]
        if missing:
            raise BackfillConfigError(f"{origin}: missing required field(s) {', '.join(missing)}.")
        try:
            return cls(**data)
        except BackfillConfigError as error:
            raise type(error)(f"{origin}: {error}") from None

    def to_mapping(self) -> dict[str, Any]:
        """A JSON-serialisable mapping that `from_mapping` turns back into this job."""
        data = asdict(self)
        if self.is_join:
            del data["source"], data["primary_key"]
            data["sources"] = {upstream.name: {"table": upstream.table, "primary_key": list(upstream.primary_key)}
                               for upstream in self.upstreams}
        else:
            del data["sources"]
            data["primary_key"] = list(self.primary_key)
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_mapping(), sort_keys=True)

    def with_overrides(self, **overrides: Any) -> BackfillJob:
        """A copy with some fields replaced (validated like the original)."""
        return replace(self, **overrides)


def _primary_key(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple) or not value:
        raise BackfillConfigError(
            f"primary_key must be a column name or a non-empty list of column names, got {value!r}."
        )
    if not all(isinstance(column, str) and column for column in value):
        raise BackfillConfigError(f"primary_key entries must be column names, got {value!r}.")
    if len(set(value)) != len(value):
        raise BackfillConfigError(f"primary_key lists a column twice: {value!r}.")
    return tuple(value)


def _upstreams(value: Any) -> tuple[Upstream, ...]:
    """The `sources` mapping as validated `Upstream`s, in declaration order."""
    if isinstance(value, tuple) and all(isinstance(item, Upstream) for item in value):
        value = {item.name: {"table": item.table, "primary_key": list(item.primary_key)} for item in value}
    example = "{orders: {table: /lake/orders, primary_key: [o_orderkey]}, customer: {...}}"
    if not isinstance(value, Mapping):
        raise BackfillConfigError(f"sources must map each upstream's name to its table and key, e.g. {example}.")
    if len(value) < 2:
        raise BackfillConfigError(
            f"sources names {len(value)} upstream; a join reads two to {MAX_JOINED_UPSTREAMS}. For one upstream "
            "use `source` and `primary_key` instead."
        )
    if len(value) > MAX_JOINED_UPSTREAMS:
        raise BackfillConfigError(
            f"sources names {len(value)} upstreams; a join MV reads at most {MAX_JOINED_UPSTREAMS}. Build an MV "
            "over some of them first and join that MV."
        )
    upstreams: list[Upstream] = []
    for name, entry in value.items():
        if not isinstance(name, str) or not _UPSTREAM_NAME_PATTERN.match(name):
            raise BackfillConfigError(
                f"upstream name {name!r} is not a SQL identifier; use letters, digits and '_' "
                "(the query reads the upstream by this name)."
            )
        if not isinstance(entry, Mapping) or set(entry) != {"table", "primary_key"}:
            got = sorted(entry) if isinstance(entry, Mapping) else type(entry).__name__
            raise BackfillConfigError(
                f"sources.{name} must have exactly `table` and `primary_key`, got {got}; e.g. {example}."
            )
        try:
            upstreams.append(Upstream(name, normalize_table_uri("table", entry["table"]),
                                      _primary_key(entry["primary_key"])))
        except BackfillConfigError as error:
            raise BackfillConfigError(f"sources.{name}: {error}") from None
    _refuse_repeated(upstreams)
    return tuple(upstreams)


def _refuse_repeated(upstreams: list[Upstream]) -> None:
    """Names are case-insensitive in Spark SQL, and one table read twice is a self-join."""
    for index, upstream in enumerate(upstreams):
        for earlier in upstreams[:index]:
            if earlier.name.lower() == upstream.name.lower():
                raise BackfillConfigError(f"sources names {upstream.name!r} twice (names ignore case).")
            if earlier.table == upstream.table:
                raise BackfillConfigError(
                    f"sources {earlier.name} and {upstream.name} are the same table ({upstream.table}): "
                    "joining a table with itself is not supported."
                )


def load_job(path: str | os.PathLike[str]) -> BackfillJob:
    """Load and validate a YAML job file."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise BackfillConfigError(f"job file {path} does not exist; check the path.") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise BackfillConfigError(f"job file {path} is not valid YAML: {error}") from None
    return BackfillJob.from_mapping(data, origin=f"job file {path}")
