package airflowbackfill.localfs;

import java.io.IOException;
import java.net.URI;
import java.net.URISyntaxException;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.DelegateToFileSystem;
import org.apache.hadoop.fs.FsConstants;
import org.apache.hadoop.fs.FsServerDefaults;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.local.LocalConfigKeys;

/**
 * The {@code file:} scheme for Hadoop's {@code FileContext}, through which Delta writes its
 * log entries: Hadoop's {@code RawLocalFs} over {@link ShellFreeRawLocalFileSystem}
 * (named by {@code fs.AbstractFileSystem.file.impl}).
 */
public class ShellFreeRawLocalFs extends DelegateToFileSystem {

  public ShellFreeRawLocalFs(URI uri, Configuration conf) throws IOException, URISyntaxException {
    super(uri, new ShellFreeRawLocalFileSystem(), conf, FsConstants.LOCAL_FS_URI.getScheme(), false);
  }

  @Override
  public int getUriDefaultPort() {
    return -1;  // a local path has no port
  }

  @Override
  public FsServerDefaults getServerDefaults(Path path) throws IOException {
    return LocalConfigKeys.getServerDefaults();
  }

  @Override
  @Deprecated
  public FsServerDefaults getServerDefaults() throws IOException {
    return LocalConfigKeys.getServerDefaults();
  }

  @Override
  public boolean isValidName(String src) {
    return true;  // local file systems differ in what they accept: the OS decides
  }
}
