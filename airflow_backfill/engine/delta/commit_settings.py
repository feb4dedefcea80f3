"""The Spark settings that keep a Delta commit on a local table from starting processes.

Without Hadoop's native library, Hadoop's local file system sets a new file's permissions
by running `chmod`, and learns a file's link status, which every rename through
`FileContext` asks for of both its paths, by running `readlink`: each a child process of
the JVM, 4.5 ms apiece on machine M. Two settings cut them:

- Delta writes each commit's checksum (the file list the engine reads tables from) with
  Spark's checkpoint file manager, by default the one that renames through `FileContext`;
  the file-system based one renames through `FileSystem.rename`, which asks nothing of the
  kind. Over 60 overwrites of a 10,000-row table on machine M (docs/benchmarks.md) a
  commit took 121 ms with the first and 87 ms with the second.
- Hadoop's default local file systems keep a hidden `.crc` file beside every file they
  write, created and renamed as the file is: twice the processes. Delta writes its log
  entries through `FileContext` (its `HDFSLogStore`), whose local file system for
  `file:` is set to the raw one, which keeps no such file (a log entry is JSON Delta
  reads whole). The `FileSystem` for `file:` stays the checksummed one: Hadoop's own code
  casts it to `LocalFileSystem` (S3A's buffers on local disk do), and Parquet's files
  keep their side files as before.

On object stores nothing changes: they rename by copying, and these settings name only
the `file:` scheme.
"""

from __future__ import annotations

CHECKPOINT_FILE_MANAGER = "spark.sql.streaming.checkpointFileManagerClass"
FILE_SYSTEM_CHECKPOINT_FILE_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)


LOCAL_FILE_CONTEXT = "spark.hadoop.fs.AbstractFileSystem.file.impl"
RAW_LOCAL_FILE_CONTEXT = "org.apache.hadoop.fs.local.RawLocalFs"


def commit_settings() -> dict[str, str]:
    """The settings, for every session and every phase's spark-submit."""
    return {CHECKPOINT_FILE_MANAGER: FILE_SYSTEM_CHECKPOINT_FILE_MANAGER, LOCAL_FILE_CONTEXT: RAW_LOCAL_FILE_CONTEXT}
