"""Counts the Spark jobs a block of test code starts.

Spark's status tracker keeps only the last `spark.ui.retainedJobs` jobs (1,000 by default),
so counting every job the session has run stops growing once a long test session has run
that many. Jobs counted inside a job group of their own are exact however long the session.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import count

_groups = count()


@contextmanager
def jobs_started(spark) -> Iterator[Callable[[], int]]:
    """Run the block in a fresh job group; yields a function giving the jobs started so far."""
    group = f"counted-{next(_groups)}"
    context = spark.sparkContext
    context.setJobGroup(group, "jobs counted by a test")
    try:
        yield lambda: len(context.statusTracker().getJobIdsForGroup(group))
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
        context.setLocalProperty("spark.job.description", None)
        context.setLocalProperty("spark.job.interruptOnCancel", None)
