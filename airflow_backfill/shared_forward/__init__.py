"""One Spark application that keeps many MVs fresh (the shared forward of a job folder)."""

DEFAULT_WORKERS = 4
"""Rounds the shared forward applies at once, by default. A round is mostly waiting: the
Python driver for the JVM's answers, the JVM for the file system. On 2 cores, fifty MVs
were freshest with 4 (docs/benchmarks.md: 2 and 3 left cores idle, 6 queued for them)."""

DEFAULT_BACKFILL_WORKERS = 2
"""MVs a folder backfilled as one builds at once, by default (the folder's backfill
parallelism). A backfill keeps the cores busier than a round (a snapshot's scan and
write), so fewer run at once than rounds; each MV's own `backfill_parallelism` still sets
its shuffle partitions."""
