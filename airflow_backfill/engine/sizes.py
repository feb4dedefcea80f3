"""Every size threshold that picks a path of the engine: the driver or Spark, a literal
condition or a join, one rule or another. One place, so that a reader finds each value and
the figure behind it here and in docs/sizes.md, and so that a test can move a threshold
and see both sides of it (tests/differential/).

Code reads the values when it decides (`sizes().driver_rows`), never copies them at import:
`AIRFLOW_BACKFILL_SIZES` or `[airflow_backfill] sizes` (a JSON object of field names and values, or the preset `spark`)
changes them for a process, `overridden(...)` for a block of code. The defaults are the
figures measured on a 2-core machine (docs/benchmarks.md); a deployment rarely needs to
change them, and never for correctness: both sides of every threshold give the same MV.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from typing import Any

from airflow_backfill.config import setting
from airflow_backfill.exceptions import BackfillConfigError

SIZES_VARIABLE = "AIRFLOW_BACKFILL_SIZES"
"""Overrides for a process: a JSON object (`{"driver_rows": 0}`) or a preset name."""


@dataclass(frozen=True)
class Sizes:
    """The thresholds, by what they choose. Each docstring says what lies on either side."""

    # ---- rows a round holds in the driver ----------------------------------------------
    driver_rows: int = 10_000
    """The most rows of a round's intermediate result the driver holds as a local relation
    (a few MB for the narrow rows of an aggregate's touched groups); larger ones stay where
    Spark computed them."""
    held_table_rows: int = 400_000
    """The most rows of a small table (an aggregate's state, a small MV) whose rounds the
    driver holds whole: TPC-H Q3's rounds at SF 10 (state 114 k groups, MV 302 k rows) took
    3.0 s and 2.9 s held, against 5.6 s and 5.9 s with a limit of 50,000."""
    held_table_bytes: int = 32 * 1024 * 1024
    """The most bytes of Parquet files of a table held whole (the 302 k-row MV above is
    3.4 MB): wide rows reach this before `held_table_rows`."""
    driver_join_rows: int = 1_000_000
    """The most rows of both sides together that the driver joins with Arrow's hash join;
    larger joins are Spark's."""
    deferred_bytes: int = 16 * 1024 * 1024
    """The most bytes of Arrow rows whose local relation reaches the JVM only when Spark
    first reads it (0.6 - 0.9 s of a TPC-H Q3 round at SF 10 saved); at most half of
    Spark's `localRelationThreshold`, so Spark then holds them locally."""

    # ---- change feeds read by the driver -----------------------------------------------
    feed_rows: int = 50_000
    """The most change rows of a range the driver reads from its files (about 10 MB of TPC-H
    line items; an RF1 + RF2 pair at SF 1 is 12 k rows), counted as the rows taken (a
    deletion vector's new marks, not its file's rows); larger ranges are read by Spark."""
    feed_bytes: int = 64 << 20
    """The most bytes a range's feed reads: files read whole count their logged size
    (checked before any footer is opened), files of which a deletion vector selects a few
    rows the row groups that hold them."""
    join_feed_rows: int = 250_000
    """The most change rows of one upstream a join round reads and nets in the driver:
    Spark's reader, cache and counts cost 1.4 s of a round at TPC-H SF 10 (an RF1 + RF2
    pair of `lineitem` is 120 k change rows)."""
    key_feed_rows: int = 5_000_000
    """The most change rows whose key columns the driver reads to tell whether a key
    gained rows (in batches, keeping only the keys whose rows do not cancel out)."""
    key_feed_bytes: int = 1 << 30
    """The most bytes of change files read for the same question."""
    range_files: int = 256
    """The most change files whose footers the driver opens for a range's key bounds."""
    listed_feed_rows: int = 20_000_000
    """The most change rows a range may hold to be read by Spark from the files its log
    lists (the driver opens their footers to count them, a few ms a file) instead of
    Delta's change-feed reader, which rebuilds the table's state."""
    listed_feed_bytes: int = 4 << 30
    """The most bytes of change files read that way."""

    # ---- finding a table's rows by key --------------------------------------------------
    literal_keys: int = 100
    """The most changed keys written out as a condition of literals (a filter Delta and
    Parquet skip files and row groups with, no semi-join); beyond, a semi-join."""
    lookup_keys: int = 100_000
    """The most distinct keys whose rows the driver looks up in a table's files (a TPC-H
    RF1 + RF2 pair at SF 10 has 30 k orders)."""
    lookup_rows: int = 500_000
    """The most matching rows a driver lookup holds; beyond, Spark reads them."""
    group_rows: int = 50_000
    """The most upstream rows of the groups a MIN, MAX or COUNT(DISTINCT) recomputes that
    the driver looks up and hands Spark as a local relation when it does not fold them
    itself (a WHERE, an argument expression: `recompute_rows`); beyond, Spark reads the
    upstream. Fifty MVs in one shared forward: groups of 20 k rows took rounds of 1.3 s
    looked up against 14 s read by Spark, groups of 200 k rows filled the 1 GiB driver
    heap (one task carries a local relation's every row) and took 20 s rounds."""
    recompute_rows: int = 4_000_000
    """The most upstream rows of the groups a MIN, MAX or COUNT(DISTINCT) recomputes that
    the driver reads and folds itself with Arrow when the query allows it (plain columns,
    no WHERE; only the groups' values reach Spark): a few columns of 4 M rows are some
    100 MB for a moment, where Spark's time travel reads every column of the upstream."""
    scan_rows: int = 20_000_000
    """The most rows whose key column a driver lookup reads after the statistics' pruning
    (20 M integers take about 0.8 s); beyond, Spark's scan on all cores."""
    key_cache_bytes: int = 256 << 20
    """The most bytes of data files' key columns a process keeps for its lookups (files
    never change once written), the least recently used dropped first: 4 upstreams of 2 M
    integer keys hold 64 MiB of them."""

    # ---- proofs of a unique key ----------------------------------------------------------
    key_check_rows: int = 200_000
    """Appended rows whose keys the driver proves unique (two 8-byte keys: about 3 MiB)."""
    key_runs: int = 10_000
    """Runs of increasing keys the driver keeps while proving keys unique from the files'
    order (a few MiB); more means the rows are in no useful order, and Spark counts them."""
    key_bitmap_bits: int = 1 << 30
    """The largest bitmap of possible keys for the dense-key proof (128 MiB): TPC-H's line
    items at SF 10 need 420 M bits."""

    # ---- writes ----------------------------------------------------------------------------
    listed_files: int = 2_000
    """The most files of a table whose file list Delta keeps in each commit's checksum: an
    overwrite, replace or delete then needs no rebuild of the table's state (a one-key
    delete from 120 files: 0.66 s listed, 1.95 s not)."""
    mv_file_rows: int = 1_000_000
    """The most rows of each MV file a snapshot writes, its rows sorted by the MV's key
    (0: Spark's own files, unsorted and unbounded): keys that lie together then sit in one
    file of each of the write's tasks, and a table of a billion rows stays within
    `listed_files` files."""
    mv_row_group_rows: int = 262_144
    """The most rows of each Parquet row group of those files (0: Parquet's own bound, 128
    MiB): a lookup of 500 neighbouring keys in a 2 M-row MV read 475,712 key values and
    0.037 s of CPU instead of 2,000,000 and 0.147 s, for a snapshot within 5 % of the CPU
    of Spark's own layout. Groups of 16,384 rows read 32,768 values but cost the snapshot
    8 - 24 % more CPU in two runs (docs/sizes.md)."""
    one_file_rows: int = 100_000
    """Tables of up to this many rows are overwritten into one file by one task (TPC-H Q3's
    state and MV overwrites at SF 1: 0.66 s in four files, 0.55 s in one)."""

    # ---- compaction of a patched table ------------------------------------------------------
    small_file_bytes: int = 8 * 1024 * 1024
    """Files smaller than this count as small for a compaction (`delta/compaction.py`): a
    round's patch file is a few kB, a snapshot's file of `mv_file_rows` narrow rows tens of
    MB."""
    compact_files: int = 32
    """More small live files than this make a table compacted by the driver."""
    rewrite_deleted_share: float = 0.5
    """A larger file whose deletion vector hides more than this share of its rows is
    rewritten by a compaction: its readers read twice the rows they keep."""
    compact_bytes: int = 64 * 1024 * 1024
    """The most bytes of files one compaction reads in the driver; a file mostly hidden but
    larger is left for OPTIMIZE or REORG (`maintenance.py`)."""

    # ---- joins ----------------------------------------------------------------------------
    small_join_rows: int = 1_000_000
    """Upstream rows, all upstreams together, up to which a join round keeps the telescoped
    rule (scanning such small tables costs less than the other rule's extra walks); above,
    the rule that walks lost and gained rows apart saves 3 - 6 s a round at TPC-H SF 10."""

    # ---- the driver JVM's compiler ----------------------------------------------------------
    small_change_share: float = 0.01
    """A pending change of at most this share of the upstream's rows is a small catch-up,
    whose driver starts with the quick JIT compiler (a cold RF1 + RF2 catch-up at SF 1:
    15.5 s instead of 21.7 s)."""
    small_upstream_rows: int = 1_000_000
    """Upstreams of at most this many rows make every catch-up small."""
    jit_epochs_read: int = 200
    """More pending epochs than this count as a large change without reading their logs."""


SPARK_EVERYWHERE = replace(
    Sizes(), driver_rows=0, held_table_rows=0, held_table_bytes=0, driver_join_rows=0, deferred_bytes=0,
    feed_rows=0, feed_bytes=0, join_feed_rows=0, key_feed_rows=0, key_feed_bytes=0, range_files=0,
    listed_feed_rows=0, listed_feed_bytes=0, literal_keys=0, lookup_keys=0, lookup_rows=0, group_rows=0,
    recompute_rows=0, scan_rows=0,
    key_check_rows=0, key_runs=0, key_bitmap_bits=0, listed_files=0, small_join_rows=0, key_cache_bytes=0,
)
"""Every driver path off: each round is Spark's and Delta's own, end to end."""

PRESETS = {"spark": SPARK_EVERYWHERE, "default": Sizes()}

_override: Sizes | None = None
_parsed: tuple[str, Sizes] | None = None


def sizes() -> Sizes:
    """The thresholds in force: `overridden`'s, else the process's `AIRFLOW_BACKFILL_SIZES`,
    else the defaults."""
    global _parsed
    if _override is not None:
        return _override
    text = setting("sizes")
    if not text:
        return Sizes()
    if _parsed is None or _parsed[0] != text:
        _parsed = (text, parse_sizes(text))
    return _parsed[1]


def parse_sizes(text: str) -> Sizes:
    """`AIRFLOW_BACKFILL_SIZES`: a preset name or a JSON object of thresholds; a clear error
    naming the bad part otherwise."""
    if text in PRESETS:
        return PRESETS[text]
    try:
        values = json.loads(text)
    except ValueError:
        values = None
    if not isinstance(values, dict):
        raise BackfillConfigError(
            f"{SIZES_VARIABLE} must be one of {', '.join(sorted(PRESETS))} or a JSON object of thresholds such as "
            f'{{"driver_rows": 5000}}, got {text!r}.')
    return with_values(Sizes(), values, origin=SIZES_VARIABLE)


def with_values(base: Sizes, values: dict[str, Any], *, origin: str) -> Sizes:
    known = {field.name: field for field in fields(Sizes)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise BackfillConfigError(f"{origin} names unknown thresholds {unknown}; known: {', '.join(known)}.")
    for name, value in values.items():
        wanted = float if known[name].type in (float, "float") else int
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (
                wanted is int and not isinstance(value, int)):
            raise BackfillConfigError(f"{origin}: {name} must be a non-negative {wanted.__name__}, got {value!r}.")
    return replace(base, **values)


@contextmanager
def overridden(**values: Any) -> Iterator[Sizes]:
    """The thresholds with `values` changed for the block (tests, benchmarks)."""
    global _override
    before = _override
    _override = with_values(sizes(), values, origin="overridden()")
    try:
        yield _override
    finally:
        _override = before
