"""Which JIT compiler a driver JVM starts with: the quick one for small catch-ups and for
the shared forward.

A catch-up that applies a small change spends most of its seconds in code that runs a
few times: Catalyst's rules over some forty small plans, Delta's commit protocol, Spark's
generated classes for inputs of a few rows. HotSpot's tiered JIT profiles that code and
compiles it again with its optimising compiler (C2), on the same two cores. Started with
the quick compiler alone (`-XX:TieredStopAtLevel=1`), a cold catch-up of one TPC-H RF1 +
RF2 pair at SF 1 takes 15.5 s instead of 21.7 s (docs/benchmarks.md). A round that
rewrites or scans the whole MV runs its scan loops in the quick compiler's slower code
(a recompute at SF 1 up to 12 % slower), so larger catch-ups of large upstreams keep the
optimising one.

The shared forward's driver starts with the quick compiler unless told otherwise: its
rounds are all small. One round at a time over the `many_mvs` mix (`bench/member_rounds.py`,
2026-12-04), the optimising compiler spent the first minutes compiling: an aggregate round
cost the JVM 1.45 CPU-s against 0.77 - 0.84 with the quick compiler alone, a stateless one
0.29 - 0.32 against 0.16 - 0.17; after seventy rounds of each MV both cost the same (0.73
and 0.13 - 0.14 CPU-s).

The quick compiler alone reserves a code cache of 48 MiB (HotSpot's default without
tiered compilation), where the optimising compiler's tiers reserve 240 MiB. A shared
forward keeping fifty MVs plans new queries every second, and Spark generates and loads
new classes for them: with 48 MiB the cache filled within a minute (`CodeCache is full.
Compiler has been disabled.`), and every round after ran in the interpreter. The shared
forward's quick compiler therefore comes with the larger cache (`QUICK_JIT_OPTIONS`); a
catch-up lives minutes and keeps one option, one word in its logged command.

A catch-up's choice is made before spark-submit from the upstream's log alone (the
change files' bytes since the MV's watermark), without Spark: the operator calls it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from airflow_backfill.engine.sizes import sizes
from airflow_backfill.exceptions import BackfillConfigError

QUICK_JIT_OPTION = "-XX:TieredStopAtLevel=1"
CODE_CACHE_OPTION = "-XX:ReservedCodeCacheSize=240m"
QUICK_JIT_OPTIONS = f"{QUICK_JIT_OPTION} {CODE_CACHE_OPTION}"
"""The quick compiler alone, with the code cache the tiered compilers would reserve."""
DRIVER_DEFAULT_JAVA_OPTIONS = "spark.driver.defaultJavaOptions"
"""Where the quick compiler goes: beside `spark.driver.extraJavaOptions` (the user's and the
class archive's), so each `--conf` value in the logged spark-submit command stays one word
and the command can be pasted into a shell."""
AUTO, QUICK, FULL = "auto", "quick", "full"
DRIVER_JIT_MODES = (AUTO, QUICK, FULL)
_USER_JIT_OPTIONS = ("-XX:TieredStopAtLevel", "-XX:-TieredCompilation", "-XX:+TieredCompilation", "-Xint")


@dataclass(frozen=True)
class PendingChange:
    """The change a catch-up will apply, guessed from the upstreams' logs."""

    change_rows: int | None
    """Estimated change rows; None when too many epochs are pending to read their logs."""
    upstream_rows: int

    @property
    def share(self) -> float | None:
        if self.change_rows is None:
            return None
        return self.change_rows / self.upstream_rows if self.upstream_rows else 1.0

    def describe(self) -> str:
        if self.change_rows is None:
            return f"more than {sizes().jit_epochs_read} epochs pending"
        share = self.share or 0.0
        return f"about {self.change_rows} change rows, {share:.2%} of the upstream's {self.upstream_rows} rows"


SHARED_FORWARD_JIT_MODES = (QUICK, FULL)
"""The shared forward's choices: its rounds are a few seconds of epochs of one MV each, so
there is no pending change to judge (`auto`); `quick` is its default."""


def check_shared_forward_mode(mode: str) -> str:
    """`mode` when it is one of SHARED_FORWARD_JIT_MODES; a clear error otherwise."""
    if mode not in SHARED_FORWARD_JIT_MODES:
        raise BackfillConfigError(
            f"driver_jit {mode!r} is not one of {', '.join(SHARED_FORWARD_JIT_MODES)} for the shared forward: "
            "'quick' (the default) starts its driver with the quick JIT compiler alone, 'full' with the "
            "optimising one too")
    return mode


def check_mode(mode: str) -> str:
    """`mode` when it is one of DRIVER_JIT_MODES; a clear error otherwise."""
    if mode not in DRIVER_JIT_MODES:
        raise BackfillConfigError(
            f"driver_jit {mode!r} is not one of {', '.join(DRIVER_JIT_MODES)}: 'auto' starts a catch-up "
            "driver with the quick JIT compiler when its pending change is small, 'quick' always, 'full' never")
    return mode


def pending_change(upstreams: Mapping[str, str], watermarks: Mapping[str, int] | None) -> PendingChange | None:
    """What a catch-up from `watermarks` (each upstream's version, by name) will apply, from
    the change files' bytes of the pending epochs and each upstream's bytes per row. None
    before the snapshot (no watermark)."""
    from airflow_backfill.engine.delta.key_range import table_rows
    from airflow_backfill.engine.delta.log import latest_version
    from airflow_backfill.engine.rounds.plan_choice import estimated_change_rows

    if watermarks is None:
        return None
    change_rows: int | None = 0
    upstream_rows = 0
    for name, uri in upstreams.items():
        latest = latest_version(uri)
        rows = table_rows(uri)
        upstream_rows += rows
        pending = latest - watermarks[name]
        if pending > sizes().jit_epochs_read:
            change_rows = None
        elif pending > 0 and change_rows is not None:
            change_rows += estimated_change_rows(uri, watermarks[name], latest, rows)
    return PendingChange(change_rows, upstream_rows)


def quick_jit_suits(change: PendingChange | None) -> bool:
    """True when the pending change is known and small, or the upstreams are."""
    if change is None:
        return False
    if change.upstream_rows <= sizes().small_upstream_rows:
        return True
    share = change.share
    return share is not None and share <= sizes().small_change_share


def sets_own_jit(*java_options: str | None) -> bool:
    """True when the user's driver options already choose the JIT compilers."""
    return any(option in (options or "") for options in java_options for option in _USER_JIT_OPTIONS)


def with_quick_jit(java_options: str | None, *, long_lived: bool = False) -> str:
    """`java_options` with the quick compiler alone added, and for a `long_lived` driver (the
    shared forward) the larger code cache."""
    added = QUICK_JIT_OPTIONS if long_lived else QUICK_JIT_OPTION
    return " ".join(part for part in ((java_options or "").strip(), added) if part)
