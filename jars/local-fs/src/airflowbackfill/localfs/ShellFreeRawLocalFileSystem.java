package airflowbackfill.localfs;

import java.io.File;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;

import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsAction;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * Hadoop's raw local file system, minus the child processes it starts without Hadoop's
 * native library: it runs {@code chmod} to set a new file's permissions and
 * {@code readlink} to learn whether a path is a link, each a process of the JVM. Both are
 * answered here with java.nio, which calls the operating system directly. A Delta commit
 * on a local table asked for five such processes; this class starts none.
 *
 * <p>Anything java.nio cannot express the same way (a sticky bit; a path that is a link)
 * is left to Hadoop's own code, so the results are Hadoop's in every case.
 */
public class ShellFreeRawLocalFileSystem extends RawLocalFileSystem {

  @Override
  public void setPermission(Path path, FsPermission permission) throws IOException {
    if (permission.getStickyBit()) {
      super.setPermission(path, permission);
      return;
    }
    File file = pathToFile(path);
    if (!file.exists()) {
      super.setPermission(path, permission);  // Hadoop's own error for a missing path
      return;
    }
    Files.setPosixFilePermissions(file.toPath(), posix(permission));
  }

  @Override
  public FileStatus getFileLinkStatus(Path path) throws IOException {
    if (Files.isSymbolicLink(new File(path.toString()).toPath())) {
      return super.getFileLinkStatus(path);
    }
    return getFileStatus(path);  // what Hadoop returns for a path that is not a link
  }

  static Set<PosixFilePermission> posix(FsPermission permission) {
    Set<PosixFilePermission> found = EnumSet.noneOf(PosixFilePermission.class);
    add(found, permission.getUserAction(),
        PosixFilePermission.OWNER_READ, PosixFilePermission.OWNER_WRITE, PosixFilePermission.OWNER_EXECUTE);
    add(found, permission.getGroupAction(),
        PosixFilePermission.GROUP_READ, PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_EXECUTE);
    add(found, permission.getOtherAction(),
        PosixFilePermission.OTHERS_READ, PosixFilePermission.OTHERS_WRITE, PosixFilePermission.OTHERS_EXECUTE);
    return found;
  }

  private static void add(Set<PosixFilePermission> found, FsAction action, PosixFilePermission read,
                          PosixFilePermission write, PosixFilePermission execute) {
    if (action.implies(FsAction.READ)) {
      found.add(read);
    }
    if (action.implies(FsAction.WRITE)) {
      found.add(write);
    }
    if (action.implies(FsAction.EXECUTE)) {
      found.add(execute);
    }
  }
}
