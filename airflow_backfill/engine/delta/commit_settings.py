"""The Spark setting that keeps a Delta commit's checksum from starting processes.

Without Hadoop's native library, Hadoop's local file system learns a file's link status,
which every rename through `FileContext` asks for of both its paths, by running `readlink`
in a child process of the JVM. Delta writes each commit's checksum (the file list the
engine reads tables from) with Spark's checkpoint file manager, by default the one that
renames through `FileContext`; the file-system based one renames through
`FileSystem.rename`, which asks nothing of the kind. Over 60 overwrites of a 10,000-row
table on machine M (docs/benchmarks.md) a commit took 121 ms with the first and 87 ms with
the second. On object stores both rename by copying, as before.
"""

from __future__ import annotations

CHECKPOINT_FILE_MANAGER = "spark.sql.streaming.checkpointFileManagerClass"
FILE_SYSTEM_CHECKPOINT_FILE_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)


def commit_settings() -> dict[str, str]:
    """The setting, for every session and every phase's spark-submit."""
    return {CHECKPOINT_FILE_MANAGER: FILE_SYSTEM_CHECKPOINT_FILE_MANAGER}
