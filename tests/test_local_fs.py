"""The project's local file system classes (`jars/local-fs`) against Hadoop's own.

They answer two questions with java.nio where Hadoop without its native library runs a
process (`chmod` to set permissions, `readlink` for a path's link status): the answers
must be Hadoop's, whatever the path is, and a Delta commit on a local table must start no
process. Delta's log entries are put-if-absent through `FileContext.rename`, which decides
from those link statuses: a rename onto an existing entry must still fail.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from airflow_backfill.engine.delta.commit_settings import (
    CHECKPOINT_FILE_MANAGER,
    COMMIT_LOCK,
    LOCAL_FILE_CONTEXT,
    SHELL_FREE_CHECKPOINT_FILE_MANAGER,
    SHELL_FREE_LOCAL_FILE_CONTEXT,
)

ROOT = Path(__file__).resolve().parents[1]
SHELL_FREE = "airflowbackfill.localfs.ShellFreeRawLocalFileSystem"
HADOOP = "org.apache.hadoop.fs.RawLocalFileSystem"


def _file_system(spark, class_name: str):
    jvm = spark.sparkContext._jvm
    parts = class_name.split(".")
    found = jvm
    for part in parts:
        found = getattr(found, part)
    file_system = found()
    file_system.initialize(jvm.java.net.URI("file:///"), spark.sparkContext._jsc.hadoopConfiguration())
    return file_system


def _path(spark, local: Path, *, qualified: bool = True):
    return spark.sparkContext._jvm.org.apache.hadoop.fs.Path(f"file://{local}" if qualified else str(local))


def _link_status(spark, class_name: str, local: Path, qualified: bool) -> tuple:
    """What a file system says of `local`'s link status, or the Java exception's class."""
    from py4j.protocol import Py4JJavaError

    try:
        status = _file_system(spark, class_name).getFileLinkStatus(_path(spark, local, qualified=qualified))
    except Py4JJavaError as error:
        return ("error", error.java_exception.getClass().getName())
    target = status.getSymlink().toString() if status.isSymlink() else None
    return (status.isFile(), status.isDirectory(), status.isSymlink(), target, status.getLen(),
            status.getPath().toString(), status.getModificationTime())


def test_the_sessions_commit_through_the_shell_free_classes(spark):
    assert spark.conf.get(CHECKPOINT_FILE_MANAGER) == SHELL_FREE_CHECKPOINT_FILE_MANAGER
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    assert hadoop.get(LOCAL_FILE_CONTEXT.removeprefix("spark.hadoop.")) == SHELL_FREE_LOCAL_FILE_CONTEXT
    assert hadoop.get("fs.file.impl") in (None, "org.apache.hadoop.fs.LocalFileSystem")  # executors' writes unchanged


def test_commits_take_the_lock_delta_takes_on_local_tables(spark, tmp_path):
    """The lock is named in the settings; on a local table it is the one Delta would take
    when left to ask the table's log store."""
    from airflow_backfill.engine import internals

    assert spark.conf.get(COMMIT_LOCK) == "true"
    spark.range(2).write.format("delta").save(str(tmp_path / "t"))
    log = internals.delta_log(spark, str(tmp_path / "t"))
    assert log.store().isPartialWriteVisible(log.logPath(), log.newDeltaHadoopConf()) is True


@pytest.mark.parametrize("qualified", [True, False], ids=["file-uri", "bare-path"])
def test_link_statuses_are_hadoops(spark, tmp_path, qualified):
    """Hadoop learns whether a path is a link from the path's text (a `file:` URI is no
    link to it, a bare path is): the same answers either way, links included."""
    (tmp_path / "file").write_bytes(b"12345")
    (tmp_path / "folder").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "file")
    (tmp_path / "folder_link").symlink_to(tmp_path / "folder")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    cases = ["file", "folder", "link", "folder_link", "dangling", "missing", "folder/missing"]
    for name in cases:
        ours, hadoops = (_link_status(spark, name_, tmp_path / name, qualified) for name_ in (SHELL_FREE, HADOOP))
        assert ours == hadoops, name
    assert _link_status(spark, SHELL_FREE, tmp_path / "link", qualified)[2] is not qualified
    assert _link_status(spark, SHELL_FREE, tmp_path / "missing", qualified)[0] == "error"


@pytest.mark.parametrize("mode", [0o644, 0o600, 0o755, 0o000, 0o777, 0o421, 0o1755])
def test_permissions_are_set_as_hadoop_sets_them(spark, tmp_path, mode):
    jvm = spark.sparkContext._jvm
    found = {}
    for class_name in (SHELL_FREE, HADOOP):
        local = tmp_path / class_name
        local.write_text("x")
        local.chmod(0o640)
        _file_system(spark, class_name).setPermission(_path(spark, local), jvm.org.apache.hadoop.fs.permission.FsPermission(mode))
        found[class_name] = stat.S_IMODE(os.stat(local).st_mode)
    assert found[SHELL_FREE] == found[HADOOP] == mode


def test_a_missing_path_fails_as_in_hadoop(spark, tmp_path):
    from py4j.protocol import Py4JJavaError

    jvm = spark.sparkContext._jvm
    for class_name in (SHELL_FREE, HADOOP):
        with pytest.raises(Py4JJavaError):
            _file_system(spark, class_name).setPermission(
                _path(spark, tmp_path / "missing"), jvm.org.apache.hadoop.fs.permission.FsPermission(0o644))


def test_a_rename_onto_a_log_entry_that_exists_fails(spark, tmp_path):
    """Delta's log store renames a written entry onto its version without overwriting:
    the second writer of a version must fail, and the first entry stay."""
    from py4j.protocol import Py4JJavaError

    jvm = spark.sparkContext._jvm
    context = jvm.org.apache.hadoop.fs.FileContext.getFileContext(
        jvm.java.net.URI("file:///"), spark.sparkContext._jsc.hadoopConfiguration())
    assert context.getDefaultFileSystem().getClass().getName() == SHELL_FREE_LOCAL_FILE_CONTEXT
    entry, second = tmp_path / "00000000000000000001.json", tmp_path / ".second.tmp"
    first = tmp_path / ".first.tmp"
    first.write_text("first")
    second.write_text("second")
    none = jvm.org.apache.hadoop.fs.Options.Rename.NONE
    renames = spark.sparkContext._gateway.new_array(jvm.org.apache.hadoop.fs.Options.Rename, 1)
    renames[0] = none
    context.rename(_path(spark, first), _path(spark, entry), renames)
    with pytest.raises(Py4JJavaError, match="FileAlreadyExistsException|already exists"):
        context.rename(_path(spark, second), _path(spark, entry), renames)
    assert entry.read_text() == "first" and second.exists() and not first.exists()


COMMITS = textwrap.dedent("""
    import os, sys
    from airflow_backfill.engine.spark_session import build_spark_session
    spark = build_spark_session("local-fs-test", 1)
    uri = sys.argv[1]
    spark.range(3).write.format("delta").save(uri)
    with open(sys.argv[2], "a") as calls:
        print("created", file=calls)
    for value in range(4):
        spark.sql(f"INSERT INTO delta.`{uri}` VALUES ({value})")
    print(spark.read.format("delta").load(uri).count())
""")


def test_delta_commits_on_local_tables_start_no_process(tmp_path):
    """`readlink` and `chmod` stand-ins first on the JVM's PATH record every call: once the
    table exists (its creation makes its folders), the commits' log entries and checksums
    make none (the Parquet files Spark's writers write still do, through the file system
    executors use)."""
    calls = tmp_path / "calls"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for command in ("readlink", "chmod"):
        real = subprocess.run(["which", command], capture_output=True, text=True, check=True).stdout.strip()
        (bin_dir / command).write_text(f'#!/bin/sh\necho "{command} $*" >>"{calls}"\nexec {real} "$@"\n')
        (bin_dir / command).chmod(0o755)
    uri = tmp_path / "table"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    completed = subprocess.run([sys.executable, "-c", COMMITS, str(uri), str(calls)], env=env, capture_output=True, text=True,
                               timeout=300, check=False)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.strip().splitlines()[-1] == "7"
    recorded = calls.read_text().splitlines()
    recorded = recorded[recorded.index("created") + 1:]
    assert any("part-" in call for call in recorded), "the stand-ins recorded nothing: the test sees no process"
    assert [call for call in recorded if "_delta_log" in call or call.startswith("readlink")] == []
    log = os.listdir(uri / "_delta_log")
    assert "00000000000000000004.json" in log and "00000000000000000004.crc" in log
    assert [name for name in log if name.startswith(".")] == []
