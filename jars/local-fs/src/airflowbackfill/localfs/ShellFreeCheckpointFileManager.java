package airflowbackfill.localfs;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager;

/**
 * The file manager Delta writes each commit's checksum file with (named by
 * {@code spark.sql.streaming.checkpointFileManagerClass}): Spark's file-system based one,
 * whose {@code file:} paths go through {@link ShellFreeRawLocalFileSystem}. It writes no
 * hidden {@code .crc} file beside the checksum (a JSON file read whole) and starts no
 * process; every other scheme (s3a, hdfs) is Spark's as before.
 */
public class ShellFreeCheckpointFileManager extends FileSystemBasedCheckpointFileManager {

  public ShellFreeCheckpointFileManager(Path path, Configuration conf) {
    super(path, shellFree(conf));
  }

  static Configuration shellFree(Configuration conf) {
    Configuration copy = new Configuration(conf);
    copy.set("fs.file.impl", ShellFreeRawLocalFileSystem.class.getName());
    copy.setBoolean("fs.file.impl.disable.cache", true);  // a file system of this class, not the cached one
    return copy;
  }
}
