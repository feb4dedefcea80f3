"""The Spark settings that keep a Delta commit on a local table from starting processes.

Without Hadoop's native library, Hadoop's local file system sets a new file's permissions
by running `chmod`, and learns a file's link status, which every rename through
`FileContext` asks for of both its paths, by running `readlink`: each a child process of
the JVM, 4.5 ms of CPU and 5 to 10 ms of wall apiece. A commit asked for five: `readlink`
of the log entry's temporary and final paths and `chmod` of the temporary one (Delta's
`HDFSLogStore` writes through `FileContext`), `chmod` of the version's checksum file and of
Hadoop's hidden `.crc` beside it.

With the project's jar (`jars/local-fs`, compiled at install time into the Delta jars'
folder, on `spark.jars` with them) a commit starts none: its classes answer both questions
with java.nio (`ShellFreeRawLocalFileSystem`), for Delta's log entries
(`fs.AbstractFileSystem.file.impl`) and for the checksum files, which Spark's file-system
based checkpoint file manager then writes without a hidden `.crc` beside them (a JSON
file read whole). Without the jar (a cluster that provides Delta itself), Hadoop's own
classes do the same with fewer savings: the raw local `FileContext` (no `.crc` beside a log
entry) and the file-system based checkpoint file manager, which renames through
`FileSystem.rename` and so asks no link status (over 60 overwrites of a 10,000-row table
on machine M a commit took 121 ms with the `FileContext` one, 87 ms with this one).

Every commit also takes Delta's lock on its table within the process
(`spark.databricks.delta.commitLock.enabled`), named rather than left for Delta to work out:
Delta otherwise copies the whole Hadoop configuration on each commit to ask the table's log
store whether a half-written log entry could be seen (yes on local disks, so the lock is
taken there anyway; 2 % of a shared-forward round's JVM time). On object stores the lock
only orders this process's own commits to one table, which a commit to them did anyway.

The `FileSystem` for `file:` stays Hadoop's checksummed one everywhere: Hadoop's own code
casts it to `LocalFileSystem` (S3A's buffers on local disk do), executors write Parquet
through it, and only the driver commits. On object stores nothing changes: these settings
name only the `file:` scheme.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

CHECKPOINT_FILE_MANAGER = "spark.sql.streaming.checkpointFileManagerClass"
FILE_SYSTEM_CHECKPOINT_FILE_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)
LOCAL_FILE_CONTEXT = "spark.hadoop.fs.AbstractFileSystem.file.impl"
RAW_LOCAL_FILE_CONTEXT = "org.apache.hadoop.fs.local.RawLocalFs"

COMMIT_LOCK = "spark.databricks.delta.commitLock.enabled"

LOCAL_FS_JAR = "airflow-backfill-local-fs.jar"
"""The jar `scripts/build_local_fs.sh` compiles from `jars/local-fs`."""
SHELL_FREE_CHECKPOINT_FILE_MANAGER = "airflowbackfill.localfs.ShellFreeCheckpointFileManager"
SHELL_FREE_LOCAL_FILE_CONTEXT = "airflowbackfill.localfs.ShellFreeRawLocalFs"


def commit_settings(jars: Sequence[str]) -> dict[str, str]:
    """The settings, for every session and every phase's spark-submit; `jars` are the ones
    on `spark.jars` (the project's classes are named only when its jar is among them)."""
    if any(os.path.basename(jar) == LOCAL_FS_JAR for jar in jars):
        return {CHECKPOINT_FILE_MANAGER: SHELL_FREE_CHECKPOINT_FILE_MANAGER,
                LOCAL_FILE_CONTEXT: SHELL_FREE_LOCAL_FILE_CONTEXT, COMMIT_LOCK: "true"}
    return {CHECKPOINT_FILE_MANAGER: FILE_SYSTEM_CHECKPOINT_FILE_MANAGER, LOCAL_FILE_CONTEXT: RAW_LOCAL_FILE_CONTEXT,
            COMMIT_LOCK: "true"}
