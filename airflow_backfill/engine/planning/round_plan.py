"""Choose how a round writes its changes: the cheapest way that gives the same table.

A round's changes can reach a Delta table in several ways, all in one commit with the
watermark, all giving the same rows; what differs is what they read and how many Spark
jobs they take:

- `append`: every changed key is new and above the table's largest key (new orders):
  one write, nothing read;
- `replace`: some change has a new row (updates, inserts, with or without deletes): the
  table's rows of every changed key are deleted by a semi-join with the keys (deletion
  vectors, key columns read) and the new rows appended, one commit (Delta's `replaceOn`;
  keys that leave without a new row are deleted from the table's listed files, or by a
  MERGE where the table does not list them);
- `delete`: every change deletes its key: a DELETE by the same semi-join;
- `patch`: the changed keys' rows, found by the driver in the files their statistics
  meet, marked deleted in deletion vectors, the new rows appended and the change written
  as a change file, all by the driver in one commit (`delta/patch_actions.py`): its cost
  follows the changed keys and the key columns read to find them, not the table's size,
  and its feed is two rows per changed row for every reader;
- `merge`: Delta's MERGE of the keyed changes: any number of keys, but dozens of small
  jobs and a shuffle of every touched file (chosen when earlier rounds corrected the
  others' estimates upwards, or for `round_plan: merge`);
- `overwrite`: the whole table written anew (its rows outside the changed keys plus the
  new rows): one job, cheapest for small tables (an aggregate's state, most aggregate MVs);
- `recompute`: the MV query over the upstream as of the round's last epoch replaces the
  whole MV, as a user would recompute it; cheapest when a round changes much of the table.
  It overwrites the MV, or, when jobs read the MV's change feed, may write only the rows
  that differ from the MV (`difference`), so that their feed stays as small as the change.

Each way's cost is estimated from the round's facts (change rows, changed keys, the rows
of the table files the keys' range touches, the table's and the upstream's rows: all
from the Delta logs or from data the round holds already) with per-row rates, then
corrected by how long earlier rounds of the same plan took against their estimates, so
the choice follows this machine and this table. Each way's estimate also counts what its
change feed costs the MV's readers (the jobs whose source the MV is), and a process's
first round of a plan counts what that plan's first use costs a fresh JVM.
Pure functions: tested without Spark.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

APPEND, REPLACE, DELETE, MERGE, OVERWRITE, RECOMPUTE, PATCH = (
    "append", "replace", "delete", "merge", "overwrite", "recompute", "patch")
WRITES = (APPEND, PATCH, REPLACE, DELETE, MERGE, OVERWRITE)
"""The ways to write keyed changes into one table (the MV, or an aggregate's state)."""

DIFFERENCE = "difference"
"""How a recompute writes the MV when jobs read its feed: only the rows that differ from the
MV (the recomputed rows compared with the MV's in one join), by a keyed write."""
DIFFERENCE_WAYS = (APPEND, PATCH, REPLACE, DELETE, MERGE)
"""The keyed writes a recompute's difference may take (an overwrite would feed every row)."""

WATERMARK_ONLY = "watermark only"
JOIN_ROUND = "join round"
"""The name a join's whole incremental rounds are remembered under, against the least
`join_before_the_feed` estimated for them: not a plan anyone picks."""
"""A round whose epochs changed no row the query reads: it only moves the watermark."""

AUTO, INCREMENTAL = "auto", "incremental"
ROUND_PLAN_CHOICES = (AUTO, INCREMENTAL, RECOMPUTE, MERGE)
"""What a job may ask for (`round_plan`): the cheapest estimate, never recompute, always
recompute, or only the ways every reader of the MV's feed reads exactly."""
FEED_FOR_EVERY_READER = (APPEND, PATCH, MERGE)
"""The ways whose change feed every Delta reader reads exactly: a patch and a MERGE write
their changes into change files. A replace, a delete and an overwrite or recompute of files with
deletion vectors leave the feed to be derived from the vectors, which Spark does and
delta-rs 1.6 does not."""

RECOMPUTE_SAVING_S = 1.0
RECOMPUTE_SAVING_SHARE = 0.2
"""A recompute rewrites the whole MV, so its change feed shows every row (MVs built on it
and other readers of the feed pay for that): `auto` takes it only when it saves at least
this many seconds and this share of the cheapest incremental estimate."""

OBSERVATIONS_KEPT = 20
"""Earlier rounds remembered per job for the corrections (the state file keeps them)."""
_CORRECTION_SAMPLES = 5
_CORRECTION_MIN_SAMPLES = 3
"""A plan is corrected once it has run this often: a JVM's first round of a kind pays for
class loading and code generation, and must not decide alone."""
_CORRECTION_BOUNDS = (0.2, 5.0)


FIRST_USE_S: Mapping[str, float] = {
    APPEND: 3.6, PATCH: 3.3, REPLACE: 4.9, DELETE: 4.9, MERGE: 9.4, OVERWRITE: 3.3, RECOMPUTE: 8.5, INCREMENTAL: 3.6}
"""What a fresh JVM's first round of each plan costs beyond the same round in a warm one
(code generation, the JIT compiler's first passes, Delta's first snapshots and commit):
`python bench/chain.py --sections cold --scale 0.1` ran catch-ups of a 0.6 M-row MV over
TPC-H lineitem, each a `spark-submit` on the class archive with the catch-up operator's
JIT choice, two rounds of 0.5 % updated line items each; the first round's seconds less
the second's, medians of two (load 7 - 10 on 2 cores): replace 4.9, merge 9.4, recompute
8.5 (11.8 when it writes the difference), the Q1 aggregate's incremental round 3.6 and
recompute 6.4. The whole small MV overwritten (SF 0.02): 3.3. `incremental`, the least
incremental round before the feed (and a join's), takes the lightest incremental round
measured; `append` the same, `delete` replace's (not measured apart). At 2 M rows under
load 13 the differences were three to four times these; the recompute's stayed the
largest. A patch's first use is the overwrite's (both a commit the driver writes). See
docs/round-plans.md, "A fresh process and its first rounds"."""


@dataclass(frozen=True)
class Rates:
    """Seconds per round and per row of each part of a round, on a 2-core machine at
    parallelism 2 (docs/round-plans.md, "The estimates"; the runs in docs/benchmarks.md). Corrections from the
    job's own rounds scale them to the machine at hand."""

    fixed: Mapping[str, float] = field(default_factory=lambda: {
        APPEND: 0.4, PATCH: 0.06, REPLACE: 1.0, DELETE: 1.7, MERGE: 3.0, OVERWRITE: 0.5, RECOMPUTE: 0.8})
    feed_fixed: float = 1.35
    """Reading, netting and mapping the change feed and preparing the keyed changes (every
    plan but a recompute chosen before the feed)."""
    driver_feed_fixed: float = 0.08
    """The same for a feed the driver reads from the change files and nets with Arrow
    (`delta/driver_feed.py`): a stateless round of a few keys took 0.16 - 0.3 s in all,
    the feed, its netting and mapping about a third of it."""
    per_driver_change_row: float = 3e-6
    """Reading and netting a change row with Arrow in the driver."""
    aggregate_fixed: float = 0.4
    """Folding an aggregate's changes into its touched groups (joined with their old state)."""
    per_change_row: float = 13e-6
    """Reading and netting a change row with Spark (120 k rows: 2.9 s with the fixed part)."""
    per_written_row: float = 0.4e-6
    """Writing a row (append, the new rows of replace, every row of an overwrite)."""
    per_read_row: float = 0.9e-6
    """Reading a row of the table being overwritten."""
    per_key: float = 20e-6
    """Joining a changed key with the table's and marking its row in a deletion vector
    (replace, delete): 1.65 s, 2.45 s and 3.3 s for 1, 6 k and 60 k keys over 6 M rows."""
    per_scanned_row: float = 0.12e-6
    """Reading the key columns of a row in the files the changes' range touches (replace, delete)."""
    per_merged_row: float = 1.2e-6
    """Shuffling and rewriting a row of a touched file (merge)."""
    per_patched_file: float = 0.004
    """A touched file's deletion vector merged, written and its actions committed (patch)."""
    per_patched_row: float = 4e-6
    """A changed key's old and new rows compared, written to the data and change files (patch)."""
    per_upstream_row: float = 0.55e-6
    """Reading an upstream row and running the query over it (recompute)."""
    prove_fixed: float = 0.3
    per_proved_row: float = 0.3e-6
    """Proving the upstream's key unique (its key columns read, one shuffle), for a recompute
    that skips the feed."""
    per_feed_key_row: float = 0.2e-6
    """Netting a change row's key columns instead, when the range inserted no row: read by the
    driver, 1.2 M change rows in 0.2 s at SF 1 (Spark, beyond `sizes.key_feed_rows`, took 2 s)."""
    per_reader_row: float = 13e-6
    """What a row of the MV's change feed costs each of its readers: an MV over it reads and
    nets the row in its own round (`per_change_row`)."""
    per_compared_row: float = 1.0e-6
    """Reading an MV row and comparing it with its recomputed row in one join by key (a
    recompute that writes only the difference): warm recomputes of 0.6 M and 2 M-row MVs
    writing the difference against overwriting (`bench/chain.py --sections cold`), less the
    difference's replace, scaled to an idle machine by the recompute's estimate over its
    measured seconds: 1.05 and 0.9 us a row."""
    first_use: Mapping[str, float] = field(default_factory=lambda: dict(FIRST_USE_S))
    """Seconds a process's first round of each plan takes beyond its warm estimate
    (`FIRST_USE_S`); `with_first_use` adds them to the plans a process has not run yet."""
    join_fixed_per_table: float = 0.6
    """The least a join round costs per upstream beyond its writes: each table's feed read and
    netted, and the walks that join the changes of one side with the others (TPC-H Q3's rounds
    over three upstreams took 2.5 s (stateless) and 3.3 - 3.6 s (aggregate) at SF 1 with the
    other tables' rows looked up by the driver, 5.8 - 6.4 s through Spark). Rounds that read
    through Spark (deletion vectors, larger changes) cost more: the job's own rounds correct it."""


@dataclass(frozen=True)
class TableFacts:
    """What a write into one table costs depends on."""

    rows: int
    """Rows of the table now (its files' statistics)."""
    touched_rows: int
    """Rows of its files whose key range meets the changes' key range (all of them when the
    key has no usable statistics)."""
    new_keys_only: bool = False
    """Every changed key lies above the table's largest key: nothing to delete."""
    patched_files: int | None = None
    """The files holding the changed keys' rows, when the driver found them (a patch can
    write the changes); None when it did not look."""


@dataclass(frozen=True)
class RoundFacts:
    """One round's size, as known before it writes."""

    change_rows: int
    changed_keys: int
    present_rows: int
    """Changed keys that have a row after the round (the others leave the table)."""
    table: TableFacts
    upstream_rows: int
    """Rows of the upstream at the round's last epoch (what a recompute reads)."""
    feed_needed_for_recompute: bool = True
    """A recompute still reads the feed to prove the key unique (verify_primary_key)."""


@dataclass(frozen=True)
class RoundPlan:
    """The way chosen, every way's estimate and why; recorded with the commit."""

    plan: str
    estimates: Mapping[str, float]
    """Seconds per way, corrected by the job's earlier rounds."""
    reason: str
    base_estimate: float = 0.0
    """The chosen way's estimate before corrections: what later rounds correct against."""
    writes: Mapping[str, str] = field(default_factory=dict)
    """How each table was written, for rounds that write several (an aggregate's state and MV)."""

    @property
    def label(self) -> str:
        """The plan in a few words: `replace`, or `incremental (state overwrite, mv merge)`."""
        if not self.writes:
            return self.plan
        return f"{self.plan} ({', '.join(f'{table} {way}' for table, way in self.writes.items())})"

    def with_writes(self, **writes: str) -> RoundPlan:
        return replace(self, writes={**self.writes, **writes})

    def to_json(self) -> str:
        data: dict[str, Any] = {"plan": self.plan, "reason": self.reason,
                                "estimates_s": {k: round(v, 3) for k, v in self.estimates.items()}}
        if self.writes:
            data["writes"] = dict(self.writes)
        return json.dumps(data, sort_keys=True)


def write_estimates(facts: TableFacts, change_keys: int, present_rows: int, rates: Rates) -> dict[str, float]:
    """Seconds each way that can apply these changes would take to write them into the table."""
    written = present_rows * rates.per_written_row
    located = facts.touched_rows * rates.per_scanned_row + change_keys * rates.per_key
    estimates = {
        OVERWRITE: (rates.fixed[OVERWRITE] + facts.rows * (rates.per_read_row + rates.per_written_row)
                    + change_keys * rates.per_change_row + written),
        MERGE: rates.fixed[MERGE] + facts.touched_rows * rates.per_merged_row + change_keys * rates.per_key + written,
    }
    if facts.new_keys_only:
        estimates[APPEND] = rates.fixed[APPEND] + written
    if facts.patched_files is not None:
        estimates[PATCH] = (rates.fixed[PATCH] + facts.patched_files * rates.per_patched_file
                            + (change_keys + present_rows) * rates.per_patched_row)
    if present_rows:  # the keys without a new row are deleted by the same replace
        estimates[REPLACE] = rates.fixed[REPLACE] + located + written
    if present_rows == 0:
        estimates[DELETE] = rates.fixed[DELETE] + located
    return estimates


def feed_rows(way: str, changed_keys: int, present_rows: int, table_rows: int) -> int:
    """Rows a write puts in the table's change feed: an appended row; a deleted key's row; a
    replaced, merged or differing key's old row and new row; an overwrite's every old row
    and every new one."""
    if way == APPEND:
        return present_rows
    if way == DELETE:
        return changed_keys
    if way in (OVERWRITE, RECOMPUTE):
        return table_rows + max(0, table_rows - changed_keys + present_rows)
    return changed_keys + present_rows


def readers_cost(rows: int, readers: int, table_rows: int, rates: Rates) -> float:
    """What a commit whose feed holds `rows` costs the table's `readers` (the jobs whose
    source it is): each reads and nets them in its next round, or, when that costs it
    more, recomputes from the table's `table_rows` and writes its own difference (so that
    its own readers see only the change). 0 without readers."""
    if readers <= 0:
        return 0.0
    reader_recompute = rates.fixed[RECOMPUTE] + table_rows * (rates.per_upstream_row + rates.per_compared_row)
    return readers * min(rows * rates.per_reader_row, reader_recompute)


def with_readers(estimates: Mapping[str, float], changed_keys: int, present_rows: int, table_rows: int,
                 readers: int, rates: Rates) -> dict[str, float]:
    """Each write's estimate plus what its feed costs the table's readers (as they were
    without readers)."""
    return {way: seconds + readers_cost(feed_rows(way, changed_keys, present_rows, table_rows), readers, table_rows,
                                        rates)
            for way, seconds in estimates.items()}


def recompute_writes(recomputed: float, table_rows: int, difference_writes: Mapping[str, float], readers: int,
                     rates: Rates, *, overwrite_write: float = 0.0) -> dict[str, float]:
    """A recompute's seconds by how it writes the MV (`recomputed`: computing it, and writing
    it whole when `overwrite_write` is 0): `overwrite`, whose feed holds every row; and,
    when the MV has readers, `difference`: the MV's rows read and compared with the
    recomputed ones, the differing rows written the cheapest of `difference_writes` (keyed
    writes' estimates with their feed's cost counted, `with_readers`)."""
    overwrite_feed = feed_rows(OVERWRITE, table_rows, table_rows, table_rows)
    ways = {OVERWRITE: recomputed + overwrite_write + readers_cost(overwrite_feed, readers, table_rows, rates)}
    allowed = [seconds for way, seconds in difference_writes.items() if way in DIFFERENCE_WAYS]
    if readers > 0 and allowed:
        ways[DIFFERENCE] = recomputed + table_rows * rates.per_compared_row + min(allowed)
    return ways


def cheapest(estimates: Mapping[str, float]) -> str:
    """The way of the lowest estimate (by name among equals)."""
    return min(estimates, key=lambda way: (estimates[way], way))


def stateless_recompute_writes(facts: RoundFacts, rates: Rates, readers: int = 0) -> dict[str, float]:
    """A stateless round's recompute (`recompute_writes`), once its feed is read."""
    feed = rates.feed_fixed + facts.change_rows * rates.per_change_row
    recomputed = rates.fixed[RECOMPUTE] + facts.upstream_rows * rates.per_upstream_row
    recomputed += feed if facts.feed_needed_for_recompute else 0.0
    writes = with_readers(write_estimates(facts.table, facts.changed_keys, facts.present_rows, rates),
                          facts.changed_keys, facts.present_rows, facts.table.rows, readers, rates)
    return recompute_writes(recomputed, facts.table.rows, writes, readers, rates)


def round_estimates(facts: RoundFacts, rates: Rates, readers: int = 0) -> dict[str, float]:
    """Seconds each way would take for the whole round (feed included, and what the MV's
    feed then costs its `readers`), before corrections."""
    feed = rates.feed_fixed + facts.change_rows * rates.per_change_row
    writes = with_readers(write_estimates(facts.table, facts.changed_keys, facts.present_rows, rates),
                          facts.changed_keys, facts.present_rows, facts.table.rows, readers, rates)
    estimates = {plan: feed + seconds for plan, seconds in writes.items()}
    estimates[RECOMPUTE] = min(stateless_recompute_writes(facts, rates, readers).values())
    return estimates


def aggregate_recompute_writes(upstream_rows: int, state_rows: int, mv_rows: int, mv_writes: Mapping[str, float],
                               rates: Rates, readers: int = 0) -> dict[str, float]:
    """An aggregate's recompute (the state from the whole upstream and overwritten) by how it
    writes the MV (`recompute_writes`; `mv_writes`: the MV's keyed writes of the round's
    changes, their feed's cost counted)."""
    state = rates.fixed[OVERWRITE] + state_rows * rates.per_written_row
    recomputed = rates.fixed[RECOMPUTE] + upstream_rows * rates.per_upstream_row + state
    return recompute_writes(recomputed, mv_rows, mv_writes, readers, rates,
                            overwrite_write=rates.fixed[OVERWRITE] + mv_rows * rates.per_written_row)


def aggregate_round_estimates(
    change_rows: int, state_writes: Mapping[str, float], mv_writes: Mapping[str, float], upstream_rows: int,
    state_rows: int, mv_rows: int, rates: Rates, readers: int = 0,
) -> dict[str, float]:
    """Seconds of an aggregate round applied incrementally (the feed folded into the touched
    groups, state and MV each written their cheapest way; `mv_writes` with their feed's
    cost to the MV's `readers` counted, `with_readers`) and recomputed (the state from the
    whole upstream, the state overwritten, the MV overwritten or, with readers, written
    its difference)."""
    feed = rates.feed_fixed + change_rows * rates.per_change_row
    recompute = aggregate_recompute_writes(upstream_rows, state_rows, mv_rows, mv_writes, rates, readers)
    return {
        INCREMENTAL: feed + rates.aggregate_fixed + min(state_writes.values()) + min(mv_writes.values()),
        RECOMPUTE: min(recompute.values()),
    }


def before_the_feed(change_rows: int, upstream_rows: int, rates: Rates, *, aggregate: bool,
                    prove_key: bool, inserts: bool = True, located: TableFacts | None = None,
                    readers: int = 0, mv_rows: int = 0, driver_feed: bool = False,
                    patchable: bool = False) -> dict[str, float]:
    """What is known before a round reads its feed (its change rows guessed from the
    change files' bytes): a recompute's estimate, and the least any incremental round
    could cost (the feed and the cheapest write's fixed cost, writing nothing). A
    recompute chosen now never reads the whole feed; under `prove_key` it proves the
    upstream's key unique: from the feed's key columns when the range `inserts` no row,
    else over the whole upstream as the snapshot does.

    `located` is the stateless MV's files as the change files' key range meets them, for
    a range that inserts no row: each of its changes updates or deletes a key the MV may
    hold, so the least write is one that finds at least half as many keys as change rows
    (an update has two) in those files, or one that overwrites the MV.

    With `readers` of the MV's feed, the recompute counts what its feed costs them
    (`recompute_before_the_feed`); the least incremental round stays a least (its feed may
    change no MV row). `driver_feed`: the range's log shows a feed the driver reads (its
    rates, not Spark's); `patchable`: the MV takes a patch, whose fixed cost is then the
    least write's."""
    if driver_feed:
        feed = rates.driver_feed_fixed + change_rows * rates.per_driver_change_row
    else:
        feed = rates.feed_fixed + change_rows * rates.per_change_row
    writes = 2 if aggregate else 1
    ways = WRITES if patchable else tuple(way for way in WRITES if way != PATCH)
    least = feed + writes * min(rates.fixed[way] for way in ways) + (rates.aggregate_fixed if aggregate else 0.0)
    if patchable and not aggregate:  # a patch compares every changed key (one per two change rows at least)
        least += change_rows // 2 * rates.per_patched_row
        return {INCREMENTAL: least, RECOMPUTE: min(recompute_before_the_feed(
            change_rows, upstream_rows, rates, aggregate=aggregate, prove_key=prove_key, inserts=inserts,
            readers=readers, mv_rows=mv_rows).values())}
    if located is not None and not aggregate:
        keys = change_rows // 2
        least = feed + min(min(write_estimates(located, keys, present, rates).values()) for present in (0, keys))
    recompute = recompute_before_the_feed(change_rows, upstream_rows, rates, aggregate=aggregate, prove_key=prove_key,
                                          inserts=inserts, readers=readers, mv_rows=mv_rows)
    return {INCREMENTAL: least, RECOMPUTE: min(recompute.values())}


def recompute_before_the_feed(change_rows: int, upstream_rows: int, rates: Rates, *, aggregate: bool, prove_key: bool,
                              inserts: bool = True, readers: int = 0, mv_rows: int = 0) -> dict[str, float]:
    """A recompute chosen before the feed, by how it writes the MV (`recompute_writes`): a
    difference is guessed at one changed MV key per two change rows (an update's two
    images), written by a replace over the whole MV."""
    recomputed = rates.fixed[RECOMPUTE] + upstream_rows * rates.per_upstream_row
    if prove_key and not aggregate:
        recomputed += (rates.prove_fixed + upstream_rows * rates.per_proved_row if inserts
                       else change_rows * rates.per_feed_key_row)
    return recompute_writes(recomputed, mv_rows, _guessed_difference(change_rows, mv_rows, readers, rates),
                            readers, rates)


def _guessed_difference(change_rows: int, mv_rows: int, readers: int, rates: Rates) -> dict[str, float]:
    keys = min(mv_rows, max(1, change_rows // 2))
    writes = write_estimates(TableFacts(rows=mv_rows, touched_rows=mv_rows), keys, keys, rates)
    return with_readers(writes, keys, keys, mv_rows, readers, rates)


def join_before_the_feed(change_rows: int, upstream_rows: int, tables: int, rates: Rates, *, aggregate: bool,
                         proved_rows: int, readers: int = 0, mv_rows: int = 0) -> dict[str, float]:
    """What a join round knows before it reads its feeds: the least its delta rule and
    writes could cost for `change_rows` (guessed from the change files' bytes) over
    `tables` upstreams, and a recompute of the join over the upstreams' `upstream_rows`
    (with its MV key proved over `proved_rows` output rows, 0 when not proved; with the
    cost of its feed to the MV's `readers`, `join_recompute_writes`)."""
    writes = 2 if aggregate else 1
    least = (tables * rates.join_fixed_per_table + change_rows * rates.per_change_row
             + writes * min(rates.fixed[way] for way in WRITES) + (rates.aggregate_fixed if aggregate else 0.0))
    recompute = join_recompute_writes(change_rows, upstream_rows, rates, proved_rows=proved_rows, readers=readers,
                                      mv_rows=mv_rows)
    return {INCREMENTAL: least, RECOMPUTE: min(recompute.values())}


def join_recompute_writes(change_rows: int, upstream_rows: int, rates: Rates, *, proved_rows: int, readers: int = 0,
                          mv_rows: int = 0) -> dict[str, float]:
    """A join's recompute by how it writes the MV (`recompute_writes`, the difference guessed
    as before a one-upstream round's feed)."""
    recomputed = rates.fixed[RECOMPUTE] + upstream_rows * rates.per_upstream_row
    if proved_rows:
        recomputed += rates.prove_fixed + proved_rows * rates.per_proved_row
    return recompute_writes(recomputed, mv_rows, _guessed_difference(change_rows, mv_rows, readers, rates),
                            readers, rates)


def with_first_use(estimates: Mapping[str, float], ran: Collection[str], rates: Rates) -> dict[str, float]:
    """`estimates` for a process that has run rounds of the plans `ran`: each plan it has not
    run yet costs its first use too (`Rates.first_use`); once the process has run any
    round, only the part beyond what every plan's first use shares (the least of them: the
    JVM's first Delta snapshot, query and commit, paid by whichever round came first)."""
    shared = min(rates.first_use.values(), default=0.0)
    result = {}
    for plan, seconds in estimates.items():
        first = rates.first_use.get(plan, 0.0)
        extra = 0.0 if plan in ran else first if not ran else max(0.0, first - shared)
        result[plan] = seconds + extra
    return result


ANY_PLAN = "*"
"""The corrections' entry for a plan that has not run often enough to have its own: the
median ratio of the job's last rounds of any plan. A loaded process (fifty MVs sharing
two cores) makes every plan slower than estimated; correcting only the plans that ran
made a never-run recompute look 2.6x cheaper beside them than it was, and a shared
forward took 30 - 44 s recomputes estimated at 1.9 s."""


def corrections(observations: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Per plan that ran at least a few times, how much longer than estimated its recent
    rounds took (median ratio of the last few, bounded), from the observations the job's
    state file keeps; under `ANY_PLAN`, the same over the last rounds of every plan."""
    ratios: dict[str, list[float]] = {}
    every: list[float] = []
    for entry in observations:
        estimate, seconds = float(entry.get("estimate_s") or 0), float(entry.get("seconds") or 0)
        if estimate > 0 and seconds > 0:
            ratios.setdefault(str(entry.get("plan")), []).append(seconds / estimate)
            every.append(seconds / estimate)
    found = {plan: bounded_correction(statistics.median(values[-_CORRECTION_SAMPLES:]), 1.0)
             for plan, values in ratios.items() if len(values) >= _CORRECTION_MIN_SAMPLES}
    if len(every) >= _CORRECTION_MIN_SAMPLES:
        found[ANY_PLAN] = bounded_correction(statistics.median(every[-_CORRECTION_SAMPLES:]), 1.0)
    return found


def correction_for(corrections_by_plan: Mapping[str, float], plan: str) -> float:
    """`plan`'s own correction, else the job's rounds of any plan's (`ANY_PLAN`), else 1."""
    return corrections_by_plan.get(plan, corrections_by_plan.get(ANY_PLAN, 1.0))


def choose(estimates: Mapping[str, float], corrections_by_plan: Mapping[str, float], requested: str) -> RoundPlan:
    """The cheapest corrected estimate among the plans `requested` allows."""
    if requested not in ROUND_PLAN_CHOICES:
        raise ValueError(f"round_plan must be one of {', '.join(ROUND_PLAN_CHOICES)}, got {requested!r}")
    corrected = {plan: seconds * correction_for(corrections_by_plan, plan) for plan, seconds in estimates.items()}
    if requested == MERGE:  # never a recompute; of the ways to write, those whose feed every reader reads
        corrected = {plan: s for plan, s in corrected.items()
                     if plan != RECOMPUTE and (plan not in WRITES or plan in FEED_FOR_EVERY_READER)}
    if requested == RECOMPUTE and RECOMPUTE in corrected:
        return RoundPlan(RECOMPUTE, corrected, "round_plan: recompute", estimates[RECOMPUTE])
    allowed = {plan: s for plan, s in corrected.items() if plan != RECOMPUTE}
    if requested == AUTO and RECOMPUTE in corrected and (not allowed or recompute_saves(
            corrected[RECOMPUTE], min(allowed.values()))):
        allowed[RECOMPUTE] = corrected[RECOMPUTE]
    plan = min(allowed, key=lambda name: (allowed[name], name))
    others = sorted((s, name) for name, s in corrected.items() if name != plan)
    reason = f"cheapest estimate {allowed[plan]:.2f} s"
    if others:
        reason += f", next {others[0][1]} {others[0][0]:.2f} s"
    if requested in (INCREMENTAL, MERGE):
        reason += f" (round_plan: {requested})"
    return RoundPlan(plan, corrected, reason, estimates[plan])


def allowed_mv_ways(estimates: Mapping[str, float], requested: str) -> dict[str, float]:
    """The ways `requested` lets a round write the MV with: under `merge`, only those whose
    feed every reader reads (an aggregate's hidden state is written any way)."""
    if requested != MERGE:
        return dict(estimates)
    return {way: seconds for way, seconds in estimates.items() if way in FEED_FOR_EVERY_READER}


def bounded_correction(seconds: float, estimate: float) -> float:
    """One measurement's correction of an estimate, within the bounds every correction keeps."""
    low, high = _CORRECTION_BOUNDS
    return min(high, max(low, seconds / estimate))


def recompute_saves(recompute: float, incremental: float) -> bool:
    """Whether a recompute is enough cheaper than the cheapest incremental way to take it."""
    return recompute <= incremental - max(RECOMPUTE_SAVING_S, RECOMPUTE_SAVING_SHARE * incremental)


def observation(plan: RoundPlan, seconds: float, epoch: int) -> dict[str, Any]:
    """What the state file keeps of a finished round for later corrections."""
    return {"plan": plan.plan, "estimate_s": round(plan.base_estimate, 4),
            "seconds": round(seconds, 4), "epoch": epoch}
