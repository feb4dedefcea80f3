"""The shared forward: one Spark application keeps many MVs fresh.

Each member (an MV, or a Kafka source job) commits on its own, with its own watermark
and writer lock, through the same rounds as the single-MV forward. A small pool of
threads shares the one SparkSession (Spark runs jobs from several threads at once); a
member is in at most one thread at a time, and a member whose round finished is polled
again at once (epochs may have arrived meanwhile) while an idle one waits
`poll_interval`. The member set is reloaded every `rescan_interval` seconds, so a job
file added to the folder joins without a restart, and a file that became invalid drops
its member and reports why.

Every line logged during a member's turn starts with the member's name (`log_names`).

Rounds start as workers free up, longest-waiting member first, except that an MV over
another member's MV goes first once that MV has committed since its own last round
started: in a plain rotation it would often start while its source's round is still
running and see that commit only a turn later.

Each worker thread runs its rounds in a session of its own (`worker_session`): one
SparkContext, JVM and cache for all, but separate temporary views and SQL settings, since
rounds register views under fixed names (`source`, the change views) and set their
shuffle partitions.

A folder backfilled as one (members that `needs_backfill()`) has its MVs built here too,
by `backfill_workers` more threads: a member whose MV is not created yet goes to a
backfill worker (its snapshot and catch-up, `backfill.py`) once every MV it reads is
created (`backfill_order.py`), the longest chain first; its turns after that are
forward rounds. A line every `progress_interval` seconds says how far the folder's
backfill is; `run(until_backfilled=True)` returns once every MV is built.

A member whose round fails is isolated: the error is logged, recorded in its MV's state
file (`forward_error`, which `airflow-backfill status` and the page show) and in the
status file, and the member is retried after a back-off that doubles up to
`max_backoff`; the other members keep their pace.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_backfill.engine import job_state
from airflow_backfill.engine.delta.log import table_exists
from airflow_backfill.engine.internals import make_active
from airflow_backfill.shared_forward import DEFAULT_BACKFILL_WORKERS, DEFAULT_WORKERS
from airflow_backfill.shared_forward.backfill_order import chain_lengths, waits_for
from airflow_backfill.shared_forward.backfill_progress import progress_line
from airflow_backfill.shared_forward.log_names import member_turn, naming_members
from airflow_backfill.shared_forward.members import LockBusy, Member

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

DEFAULT_POLL_INTERVAL = 0.5
DEFAULT_RESCAN_INTERVAL = 15.0
DEFAULT_MAX_BACKOFF = 60.0
DEFAULT_PROGRESS_INTERVAL = 10.0
BACKFILLED = "every MV backfilled"
"""`SharedForwardResult.stopped_by` of `run(until_backfilled=True)` once every MV is built."""


@dataclass(frozen=True)
class MemberSet:
    """What a reload found: members by name, and load errors by job file."""

    members: Mapping[str, Member]
    errors: Mapping[str, str] = field(default_factory=dict)
    declarations: Mapping[str, Any] = field(default_factory=dict)
    """Each member's declaration (compared between reloads: a changed job is a new member)."""
    files: Mapping[str, str] = field(default_factory=dict)
    """Each member's job file, so that a file that fails to load drops its member."""


@dataclass
class MemberStatus:
    """What the loop knows of one member (also what the status file shows)."""

    member: Member
    next_check: float = 0.0
    running: Future[int] | None = None
    commits: int = 0
    failures: int = 0
    waiting: str | None = None
    last_error: str | None = None
    last_commit_at: float | None = None
    started: float = -float("inf")
    """When its last round was handed to a worker (monotonic seconds)."""
    committed: float = -float("inf")
    """When its last commit was collected (monotonic seconds)."""
    backfill: bool | None = None
    """Its MV is to be built here (None: not asked yet; False once built, or never)."""
    backfilling: bool = False
    """`running` is its backfill (on a backfill worker), not a round."""
    backfill_seconds: float | None = None
    """How long its backfill here took, once it is built."""

    @property
    def phase(self) -> str:
        """`backfill` while its MV is to be built here, else `forward`."""
        return "backfill" if self.backfill else "forward"

    def summary(self) -> dict[str, Any]:
        return {"kind": self.member.kind, "target": self.member.target, "commits": self.commits,
                "failures": self.failures, "waiting": self.waiting, "last_error": self.last_error,
                "last_commit_at": self.last_commit_at, "phase": self.phase,
                "backfill_seconds": self.backfill_seconds}


@dataclass(frozen=True)
class SharedForwardResult:
    commits: dict[str, int]
    failures: dict[str, int]
    stopped_by: str


def worker_session(spark: SparkSession) -> SparkSession:
    """A session on `spark`'s context with its own temporary views and SQL settings, starting
    from `spark`'s current settings."""
    session = spark.newSession()
    for key, value in spark.conf.getAll.items():
        if spark.conf.isModifiable(key):
            session.conf.set(key, value)
    return session


class SharedForward:
    """The loop; `run()` returns when `stop` is set or `max_seconds` passed."""

    def __init__(
        self,
        spark: SparkSession,
        load: Callable[[], MemberSet],
        *,
        workers: int = DEFAULT_WORKERS,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        rescan_interval: float = DEFAULT_RESCAN_INTERVAL,
        max_backoff: float = DEFAULT_MAX_BACKOFF,
        status_path: str | None = None,
        backfill_workers: int = DEFAULT_BACKFILL_WORKERS,
        progress_interval: float = DEFAULT_PROGRESS_INTERVAL,
    ) -> None:
        self.spark = spark
        self.load = load
        self.workers = workers
        self.backfill_workers = backfill_workers
        self.progress_interval = progress_interval
        self.chains: dict[str, int] = {}
        self._last_progress: str | None = None
        self.poll_interval = poll_interval
        self.rescan_interval = rescan_interval
        self.max_backoff = max_backoff
        self.status_path = status_path
        self.members: dict[str, MemberStatus] = {}
        self.declarations: dict[str, Any] = {}
        self.load_errors: dict[str, str] = {}
        self._thread = threading.local()
        self._round_ended = threading.Event()

    def run(self, stop: threading.Event, max_seconds: float | None = None, *,
            until_backfilled: bool = False) -> SharedForwardResult:
        """Keep the members fresh until `stop` is set or `max_seconds` passed; with
        `until_backfilled`, return once no member's MV is left to build here."""
        started = time.monotonic()
        rescanned = -float("inf")
        written = reported = -float("inf")
        stopped_by = "stop request"
        with naming_members(), ThreadPoolExecutor(max_workers=self.workers,
                                                  thread_name_prefix="shared-forward") as pool, \
                ThreadPoolExecutor(max_workers=self.backfill_workers, thread_name_prefix="backfill") as backfills:
            try:
                while not stop.is_set():
                    now = time.monotonic()
                    if max_seconds is not None and now - started >= max_seconds:
                        stopped_by = "max_seconds"
                        break
                    if now - rescanned >= self.rescan_interval:
                        self.reload()
                        rescanned = now
                    self.collect(now)
                    if until_backfilled and self.backfilled():
                        stopped_by = BACKFILLED
                        break
                    self.dispatch(pool, now, backfills)
                    if self.status_path and now - written >= 1.0:
                        self.write_status()
                        written = now
                    if now - reported >= self.progress_interval:
                        self.report_progress()
                        reported = now
                    # Woken as soon as a round ends, so that a worker never waits for the next tick.
                    self._round_ended.wait(min(0.05, self.poll_interval))
                    self._round_ended.clear()
            finally:
                # The rounds in flight commit (never torn); their outcome is recorded as usual.
                wait([status.running for status in self.members.values() if status.running is not None])
                self.collect(time.monotonic())
                for status in self.members.values():
                    status.member.close()
                if self.status_path:
                    self.write_status()
                self.report_progress()
        log.info("shared forward stopped (%s): %s", stopped_by,
                 {name: status.commits for name, status in self.members.items()})
        return SharedForwardResult({name: s.commits for name, s in self.members.items()},
                                   {name: s.failures for name, s in self.members.items()}, stopped_by)

    def reload(self) -> None:
        """Take the members a reload finds; a member whose declaration changed starts anew."""
        try:
            found = self.load()
        except Exception as error:  # the folder itself is unreadable: keep what runs
            log.error("shared forward: reloading the members failed, keeping the current ones: %s", error)
            return
        for path, message in found.errors.items():
            if self.load_errors.get(path) != message:
                log.error("shared forward: %s", message)
        self.load_errors = dict(found.errors)
        for name in list(self.members):
            if name not in found.members or found.declarations.get(name) != self.declarations.get(name):
                status = self.members[name]
                if status.running is None:
                    status.member.close()
                    del self.members[name]
                    self.declarations.pop(name, None)
                    log.info("shared forward: %s left the set", name)
        for name, member in found.members.items():
            if name not in self.members:
                self.members[name] = MemberStatus(member)
                self.declarations[name] = found.declarations.get(name)
                log.info("shared forward: %s (%s) joined the set", name, member.kind)
        self.chains = chain_lengths(status.member for status in self.members.values())

    def backfilled(self) -> bool:
        """No member's MV is left to build here (each asked at least once)."""
        return bool(self.members) and all(status.backfill is False for status in self.members.values())

    def report_progress(self) -> None:
        """The folder backfill's progress line, while MVs are left to build (and once when
        the last is built)."""
        line = progress_line(self.members.values())
        if line and line != self._last_progress:
            log.info("%s", line)
        elif line and any(status.backfill for status in self.members.values()):
            log.info("%s", line)
        self._last_progress = line

    def collect(self, now: float) -> None:
        """Record the rounds that finished."""
        for name, status in self.members.items():
            future = status.running
            if future is None or not future.done():
                continue
            status.running = None
            backfilled, status.backfilling = status.backfilling, False
            try:
                commits = future.result()
            except LockBusy as busy:
                status.waiting = f"writer lock held elsewhere: {busy}"
                status.next_check = now + self.poll_interval
                continue
            except Exception as error:
                self.failed(name, status, error, now, backfill=backfilled)
                continue
            if backfilled:
                status.backfill = False
                status.backfill_seconds = round(now - status.started, 3)
                status.waiting = None
                log.info("shared forward: %s is built (%.1f s); its forward rounds follow", name,
                         status.backfill_seconds)
            if status.failures:
                log.info("shared forward: %s recovered after %s failure(s)", name, status.failures)
            status.failures = 0
            status.last_error = None
            if commits:
                status.commits += commits
                status.last_commit_at = time.time()
                status.committed = now
                status.next_check = now
            else:
                status.next_check = now + self.poll_interval

    def failed(self, name: str, status: MemberStatus, error: Exception, now: float, *, backfill: bool = False) -> None:
        status.failures += 1
        status.last_error = f"{type(error).__name__}: {error}"
        backoff = min(self.max_backoff, self.poll_interval * 2 ** status.failures)
        status.next_check = now + backoff
        # The traceback once per run of failures: enough to find the cause, not fifty a minute.
        log.error("shared forward: %s failed (%s in a row), retrying in %.1f s: %s",
                  name, status.failures, backoff, status.last_error, exc_info=error if status.failures == 1 else None)
        forget = getattr(status.member, "forget", None)
        if forget is not None:
            forget()
        if backfill:  # the MV may not exist yet: its state file says why it is not being built
            job_state.update_state(status.member.target, backfill_error=status.last_error, backfill_error_at=time.time())
        elif table_exists(status.member.target):  # never recreate the folder of a deleted MV
            job_state.update_state(status.member.target, forward_error=status.last_error,
                                   forward_error_at=time.time())

    def dispatch(self, pool: ThreadPoolExecutor, now: float, backfills: ThreadPoolExecutor | None = None) -> None:
        """Hand due members to the free workers: MVs to build to the backfill workers (the
        longest chain first, once what they read is built), the others' rounds to the
        forward workers in `priority` order."""
        running = [status for status in self.members.values() if status.running is not None]
        free = self.workers - sum(not status.backfilling for status in running)
        due = [status for status in self.members.values() if status.running is None and status.next_check <= now]
        for status in due:
            if status.backfill is None:  # asked once (a state file read): after it, the loop knows
                status.backfill = status.member.needs_backfill()
        if backfills is not None:
            self.dispatch_backfills(backfills, [status for status in due if status.backfill], now,
                                    self.backfill_workers - sum(status.backfilling for status in running))
        rounds = [status for status in due if not status.backfill]
        committed = {status.member.target: status.committed for status in self.members.values()}
        for status in sorted(rounds, key=lambda status: self.priority(status, committed))[:max(0, free)]:
            self.submit(pool, status, self.step, now)

    def dispatch_backfills(self, pool: ThreadPoolExecutor, due: list[MemberStatus], now: float, free: int) -> None:
        """Start the backfills that may start, while backfill workers are free."""
        if free <= 0:
            return
        by_target = {status.member.target: status.member for status in self.members.values()}
        for status in sorted(due, key=lambda status: (-self.chains.get(status.member.name, 0), status.started)):
            if free <= 0:
                return
            source = waits_for(status.member, by_target)
            paused = source is None and status.member.backfill_paused()
            if source is not None or paused:
                status.waiting = "paused" if paused else f"backfill waits for {source}"
                status.next_check = now + self.poll_interval
                continue
            status.waiting = None
            status.backfilling = True
            self.submit(pool, status, self.backfill_step, now)
            free -= 1

    def submit(self, pool: ThreadPoolExecutor, status: MemberStatus, turn: Callable[[MemberStatus], int],
               now: float) -> None:
        status.started = now
        status.running = pool.submit(turn, status)
        status.running.add_done_callback(lambda _: self._round_ended.set())

    @staticmethod
    def priority(status: MemberStatus, committed: Mapping[str, float]) -> tuple[bool, float]:
        """Sort key: a member whose source (another member's MV) committed since its last
        round started, then the one whose last round started longest ago."""
        source_moved = any(committed.get(source, -float("inf")) > status.started for source in status.member.sources)
        return (not source_moved, status.started)

    def step(self, status: MemberStatus) -> int:
        """One member's turn, in a worker thread: check, then a round if one is due (its log
        lines name the member)."""
        with member_turn(status.member.name):
            return self._turn(status)

    def _turn(self, status: MemberStatus) -> int:
        member = status.member
        status.waiting = member.waiting()
        if status.waiting is not None or not member.pending():
            return 0
        return member.run_round(self.thread_session())

    def backfill_step(self, status: MemberStatus) -> int:
        """One member's backfill, in a backfill worker (its log lines name the member)."""
        with member_turn(status.member.name):
            return status.member.run_backfill(self.thread_session())

    def thread_session(self) -> SparkSession:
        """This worker thread's session, made active for the turn."""
        session = getattr(self._thread, "spark", None)
        if session is None:
            session = self._thread.spark = worker_session(self.spark)
        make_active(session)
        return session

    def status(self) -> dict[str, Any]:
        return {"updated_at": time.time(), "pid": os.getpid(),
                "members": {name: status.summary() for name, status in sorted(self.members.items())},
                "load_errors": dict(sorted(self.load_errors.items()))}

    def write_status(self) -> None:
        """The status file, replaced atomically (readers never see half of it)."""
        assert self.status_path is not None
        partial = f"{self.status_path}.{os.getpid()}.tmp"
        with open(partial, "w", encoding="utf-8") as handle:
            json.dump(self.status(), handle, indent=1, sort_keys=True)
        os.replace(partial, self.status_path)
