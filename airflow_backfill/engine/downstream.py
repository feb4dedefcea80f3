"""The jobs whose source an MV is: who reads the MV's change feed, for the MV's round plans.

Why: a round of an MV picks the cheapest way to write its changes, and the cheapest for
the MV alone (an overwrite, a recompute) can give a change feed of every row, which each
MV over it then reads whole. The round counts that cost only if it knows the MV's
readers. A job cannot see the other jobs' files (they may live in other DAG folders), and
the MV's own table property would take a metadata commit, which conflicts with the MV's
writer; so each job over an MV registers itself in a small file beside that MV's state
(`<mv>/_airflow_backfill/readers/<job name>.json`) when a phase of it starts, and the
MV's rounds list that folder. A registration whose job's target is gone (the job was
deleted with its MV) no longer counts; one whose job always recomputes (`round_plan:
recompute`) reads no feed and does not count either. Losing a registration loses no
data: the MV's rounds only choose as they did without readers.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_backfill.engine.job_state import STATE_FILE, state_dir
from airflow_backfill.engine.planning.round_plan import RECOMPUTE
from airflow_backfill.storage import files
from airflow_backfill.storage.uri import join

if TYPE_CHECKING:
    from airflow_backfill.job import BackfillJob

log = logging.getLogger(__name__)

READERS_DIR = "readers"


@dataclass(frozen=True)
class DownstreamJob:
    """A job registered as reading an MV."""

    name: str
    target: str
    round_plan: str
    registered_at: float

    @property
    def reads_the_feed(self) -> bool:
        """A job that always recomputes reads its source whole, never its feed."""
        return self.round_plan != RECOMPUTE


def readers_dir(target: str) -> str:
    return join(state_dir(target), READERS_DIR)


def is_engine_mv(uri: str) -> bool:
    """Whether the table at `uri` is an MV some job of this engine maintains (it has the job's
    state file): only such a table takes registrations; a user's upstream table is left
    alone."""
    return files.exists(join(state_dir(uri), STATE_FILE))


def register_downstream(job: BackfillJob) -> list[str]:
    """Register `job` with each of its upstreams that is an MV of this engine; returns their
    URIs. A registration that cannot be written (a read-only upstream) is logged and
    skipped: the upstream's rounds then plan as without this reader."""
    registered = []
    for upstream in job.upstreams:
        try:
            if not is_engine_mv(upstream.table):
                continue
            entry = {"job": job.name, "target": job.target, "round_plan": job.round_plan,
                     "registered_at": round(time.time(), 3)}
            files.write_text(join(readers_dir(upstream.table), f"{job.name}.json"), json.dumps(entry, sort_keys=True))
            registered.append(upstream.table)
        except OSError as error:
            log.warning("could not register job %s as a reader of %s's change feed (%s): that MV's rounds will "
                        "not count what their feed costs this job", job.name, upstream.table, error)
    return registered


def downstream_jobs(target: str) -> list[DownstreamJob]:
    """The jobs registered as reading the MV at `target` whose own MV (or its state) still
    exists, by name."""
    found = []
    directory = readers_dir(target)
    for name in sorted(files.list_names(directory)):
        if not name.endswith(".json"):
            continue
        text = files.read_text(join(directory, name))
        try:
            entry = json.loads(text or "")
            job = DownstreamJob(str(entry["job"]), str(entry["target"]), str(entry.get("round_plan", "")),
                                float(entry.get("registered_at", 0.0)))
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring the unreadable reader registration %s", join(directory, name))
            continue
        if files.is_directory(state_dir(job.target)):
            found.append(job)
    return found


def feed_readers_count(target: str) -> int:
    """How many registered jobs read the MV's change feed (`downstream_jobs` that do not
    always recompute)."""
    return sum(1 for job in downstream_jobs(target) if job.reads_the_feed)
