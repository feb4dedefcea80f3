"""What the shared forward keeps fresh: one member per MV, and one per Kafka source job.

A member answers three questions cheaply (from Delta log listings and small state files,
no Spark) and runs one round when there is work:

- `waiting()`: why it may not run yet (its backfill is still creating the MV, it is
  paused by `airflow-backfill alter --rate-limit 0`), or None;
- `pending()`: whether its upstream has epochs the MV does not reflect;
- `run_round(spark)`: one commit, through the same round code as the single-MV forward
  (`rounds_for(job).apply(...)`), under the MV's writer lock;
- `is_created()`: whether its table is built, so that MVs over it may start their backfill.

An MV of a folder backfilled as one (`DeltaMember(..., backfill=True)`) also builds its
MV: while `needs_backfill()`, the loop hands it to a backfill worker (`run_backfill`,
`backfill.py`), and its turns after that are forward rounds.

The writer lock is taken for each round, not for the member's lifetime, so a catch-up
that a DAG run starts for the same MV (after the shared forward was stopped for a while)
takes turns with it instead of failing; a round that finds the lock held waits for the
next poll (`LockBusy`). A Kafka source job is the table's only writer and holds its lock
and heartbeat for as long as it is a member, as the source job task does.
"""

from __future__ import annotations

import logging
from contextlib import ExitStack
from typing import TYPE_CHECKING, Protocol

from airflow_backfill.engine import control, job_state
from airflow_backfill.engine.delta.log import latest_version, table_exists
from airflow_backfill.engine.phases.rounds import Rounds, rounds_for
from airflow_backfill.engine.writer_lock import writer_lock
from airflow_backfill.exceptions import TargetError
from airflow_backfill.job import BackfillJob
from airflow_backfill.shared_forward.locks import LockBusy, locked

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_backfill.kafka.config import KafkaBackfillJob, KafkaSourceJob

log = logging.getLogger(__name__)

WAIT_CREATING = "creating"
WAIT_PAUSED = "paused"
WAIT_NO_MV = "no MV yet"


def gone(name: str, target: str) -> TargetError:
    """A followed MV whose table disappeared: reported and retried, never recreated here."""
    return TargetError(
        f"the MV {target} of job {name} no longer exists (its table was deleted while the shared forward "
        "kept it fresh); run the job's DAG to build it again, or remove its job file."
    )


class Member(Protocol):
    """One table the shared forward keeps fresh."""

    name: str
    kind: str
    target: str
    sources: tuple[str, ...]
    """The tables its rounds read (another member's target when it is an MV over an MV)."""

    def waiting(self) -> str | None:
        """Why the member may not run a round now, or None."""

    def pending(self) -> bool:
        """Whether a round would commit something."""

    def run_round(self, spark: SparkSession) -> int:
        """Apply what is pending in one commit; the number of commits made (0 or 1)."""

    def close(self) -> None:
        """Release what the member holds (locks, heartbeats)."""

    def is_created(self) -> bool:
        """Whether its table is built (what an MV over it waits for before its backfill)."""

    def needs_backfill(self) -> bool:
        """Whether the loop should build its MV (a member of a folder backfilled as one whose
        MV is not created yet)."""

    def run_backfill(self, spark: SparkSession) -> int:
        """Snapshot and catch up its MV; 1 once it is created (0: nothing was due)."""

    def backfill_paused(self) -> bool:
        """Whether `alter --rate-limit 0` holds its backfill (it would hold a worker)."""


__all__ = ["DeltaMember", "KafkaMvMember", "KafkaSourceMember", "LockBusy", "Member"]


def _locked(target: str, name: str) -> ExitStack:
    """The MV's writer lock for one forward round, or LockBusy."""
    return locked(target, name, job_state.PHASE_FORWARD)


class _NoBackfill:
    """Members whose table some other task builds (a Kafka pipeline's backfill, a source job)."""

    def needs_backfill(self) -> bool:
        return False

    def run_backfill(self, spark: SparkSession) -> int:
        return 0

    def backfill_paused(self) -> bool:
        return False


class DeltaMember:
    """An MV over Delta upstreams (one, or a join's): its forward rounds once its catch-up
    handed over; with `backfill`, its snapshot and catch-up before that."""

    kind = "delta"

    def __init__(self, job: BackfillJob, parallelism: int | None = None, *, backfill: bool = False) -> None:
        self.job = job
        self.name = job.name
        self.target = job.target
        self.sources: tuple[str, ...] = tuple(upstream.table for upstream in job.upstreams)
        self.parallelism = parallelism or job.parallelism
        self.backfill = backfill
        self._rounds: Rounds | None = None
        self._watermark: int | None = None
        self._followed = False
        self._created = False

    def is_created(self) -> bool:
        if not self._created:  # once created it stays so (a deleted MV is `gone`, not uncreated)
            self._created = (job_state.read_state(self.target).get("state") == job_state.STATE_CREATED
                             and table_exists(self.target))
        return self._created

    def needs_backfill(self) -> bool:
        return self.backfill and not self._followed and not self.is_created()

    def run_backfill(self, spark: SparkSession) -> int:
        from airflow_backfill.shared_forward.backfill import backfill_mv

        if self.is_created():  # built meanwhile by another process (a per-job DAG's tasks)
            return 0
        backfill_mv(spark, self.job)
        self.forget()
        self._created = True
        return 1

    def backfill_paused(self) -> bool:
        return control.effective_settings(self.job).paused

    def waiting(self) -> str | None:
        if self._followed and not table_exists(self.target):
            raise gone(self.name, self.target)
        state = job_state.read_state(self.target)
        if not state or not table_exists(self.target):
            return WAIT_NO_MV
        if state.get("state") != job_state.STATE_CREATED:
            return WAIT_CREATING
        if control.effective_settings(self.job).paused:
            return WAIT_PAUSED
        self._followed = self._created = True
        return None

    def rounds(self) -> Rounds:
        """Planned once (the query, the upstreams' checks); planned again after a failure."""
        if self._rounds is None:
            self._rounds = rounds_for(self.job)
            self._watermark = self._rounds.watermark()
        return self._rounds

    def pending(self) -> bool:
        rounds = self.rounds()
        if self._watermark is None:
            self._watermark = rounds.watermark()
        return rounds.forward_end(self._watermark, rounds.latest()) > self._watermark

    def run_round(self, spark: SparkSession) -> int:
        with _locked(self.target, self.name):
            rounds = self.rounds()
            watermark = rounds.watermark()  # under the lock: another writer may have moved it
            end = rounds.forward_end(watermark, rounds.latest())  # the job's round_alignment, if any
            if end <= watermark:
                self._watermark = watermark
                return 0
            applied = rounds.apply(spark, end, phase=job_state.PHASE_FORWARD, parallelism=self.parallelism)
            self._watermark = applied.end_version if applied else end
        job_state.update_state(self.target, phase=job_state.PHASE_FORWARD, watermark=self._watermark,
                               forward_error=None, forward_shared=True)
        return 1 if applied else 0

    def forget(self) -> None:
        """Plan again before the next round (after a failure: the MV or upstream may have changed)."""
        self._rounds = None
        self._watermark = None

    def close(self) -> None:
        self.forget()


class KafkaMvMember(_NoBackfill):
    """A Kafka pipeline's MV once every split is Finished: it follows the source table."""

    kind = "kafka"

    def __init__(self, job: KafkaBackfillJob) -> None:
        self.job = job
        self.name = job.name
        self.target = job.target
        self.sources: tuple[str, ...] = (job.source_table,)
        self._followed = False

    def is_created(self) -> bool:
        from airflow_backfill.kafka.positions import backfill_position

        return self._followed or (table_exists(self.target) and backfill_position(self.target).finished)

    def waiting(self) -> str | None:
        from airflow_backfill.kafka.positions import backfill_position

        if not table_exists(self.target):
            if self._followed:
                raise gone(self.name, self.target)
            return WAIT_NO_MV
        if not backfill_position(self.target).finished:
            return WAIT_CREATING
        if control.read_overrides(self.target).get("rate_limit") == control.PAUSED_RATE_LIMIT:
            return WAIT_PAUSED
        self._followed = True
        return None

    def pending(self) -> bool:
        from airflow_backfill.kafka.positions import backfill_position

        if not table_exists(self.job.source_table):
            return False
        applied = backfill_position(self.target).source_version
        return applied is None or latest_version(self.job.source_table) > applied

    def run_round(self, spark: SparkSession) -> int:
        from airflow_backfill.kafka.source_backfill import run_backfill_round

        with _locked(self.target, self.name):
            result = run_backfill_round(spark, self.job)
        if result.committed:
            job_state.update_state(self.target, phase=job_state.PHASE_FORWARD, forward_error=None,
                                   forward_shared=True)
        return 1 if result.committed else 0

    def forget(self) -> None:
        """Nothing is cached between rounds."""

    def close(self) -> None:
        """Nothing is held between rounds."""


class KafkaSourceMember(_NoBackfill):
    """A Kafka source job: appends the topic to its Delta table, forward only.

    Holds the table's writer lock and heartbeat while it is a member, so the Kafka
    backfills over it see a running source job; when another source job holds the table
    (a task of its own), this member waits as a standby and takes over when it stops.
    """

    kind = "kafka_source"

    def __init__(self, job: KafkaSourceJob) -> None:
        self.job = job
        self.name = job.name
        self.target = job.table
        self.sources: tuple[str, ...] = ()  # a topic, not a table
        self._held: ExitStack | None = None

    def is_created(self) -> bool:
        return table_exists(self.target)

    def waiting(self) -> str | None:
        if self._held is not None:
            return None
        from airflow_backfill.kafka.liveness import SOURCE_JOB, beating
        from airflow_backfill.kafka.source_job import PHASE

        stack = ExitStack()
        try:
            stack.enter_context(writer_lock(self.job.table, self.job.name, PHASE))
        except TargetError:
            stack.close()
            return "standby: another source job ingests this table"
        stack.enter_context(beating(self.job.table, SOURCE_JOB))
        self._held = stack
        return None

    def pending(self) -> bool:
        return True  # the topic's end offsets are only known by asking the brokers: the round asks

    def run_round(self, spark: SparkSession) -> int:
        from airflow_backfill.kafka.source_job import run_source_round

        return 1 if run_source_round(spark, self.job).committed else 0

    def forget(self) -> None:
        self.close()

    def close(self) -> None:
        if self._held is not None:
            self._held.close()
            self._held = None
