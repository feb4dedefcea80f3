"""A class-data-sharing archive for the phases' driver JVMs: a cheaper cold start.

Every phase is its own `spark-submit`, and a fresh driver JVM spends seconds loading and
verifying Spark's and Delta's classes before and during its first round. Java 17 can map
the classes a previous JVM loaded from an archive file instead (`-XX:SharedArchiveFile`,
written by `-XX:ArchiveClassesAtExit`): `airflow-backfill jvm-archive` runs a small
snapshot and catch-up once to write it, and the operators start each phase's driver on it.

The JVM accepts an archive only on the exact classpath it was written with, and refuses a
classpath that holds a non-empty folder. spark-submit always puts `SPARK_CONF_DIR` on the
driver's classpath, so a phase started on the archive gets an empty conf folder of the
archive's own, and the settings file the usual folder held (`spark-defaults.conf`) is
passed with `--properties-file`. A conf folder that holds anything else (log4j, Hadoop or
Hive files the JVM reads from the classpath) keeps the phases off the archive.

Free of Spark imports: the Airflow operators call it before `spark-submit`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from airflow_backfill import __version__
from airflow_backfill.config import cache_dir, setting
from airflow_backfill.engine.delta.jars import delta_spark_conf
from airflow_backfill.exceptions import BackfillConfigError

log = logging.getLogger(__name__)

ARCHIVE_VARIABLE = "AIRFLOW_BACKFILL_JVM_ARCHIVE"
"""The archive's path, or `off` to start every driver without one (the `[airflow_backfill]
jvm_archive` option's override)."""
OFF = "off"
DEFAULTS_FILE = "spark-defaults.conf"
DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"
BUILD_TIMEOUT_S = 900.0


def default_archive_path(environ: Mapping[str, str] = os.environ) -> str:
    """In the provider's user cache, a folder per provider version (never beside the package,
    which may not be writable)."""
    return os.path.join(cache_dir(environ), "jvm", __version__, "driver.jsa")


def archive_path(environ: Mapping[str, str] = os.environ) -> str | None:
    """The archive the settings name (None when it is switched off)."""
    configured = setting("jvm_archive", environ)
    if configured.lower() == OFF:
        return None
    return os.path.abspath(os.path.expanduser(configured)) if configured else default_archive_path(environ)


def _conf_dir(path: str) -> str:
    return os.path.join(os.path.dirname(path), "conf")


def _manifest(path: str) -> str:
    return path + ".json"


def _spark_home(environ: Mapping[str, str]) -> str | None:
    if environ.get("SPARK_HOME"):
        return environ["SPARK_HOME"]
    spec = importlib.util.find_spec("pyspark")
    return os.path.dirname(spec.origin) if spec is not None and spec.origin else None


def _java(environ: Mapping[str, str]) -> str | None:
    home = environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return os.path.realpath(java) if java and os.path.exists(java) else None


def _user_conf_dir(environ: Mapping[str, str]) -> str | None:
    if environ.get("SPARK_CONF_DIR"):
        return environ["SPARK_CONF_DIR"]
    home = _spark_home(environ)
    return os.path.join(home, "conf") if home else None


def fingerprint(environ: Mapping[str, str] = os.environ) -> str:
    """What the archive depends on: the Java runtime and every jar the driver loads
    (Spark's, Delta's and S3A's), by name, size and modification time."""
    files: list[str] = []
    java = _java(environ)
    if java:
        files.append(java)
    home = _spark_home(environ)
    if home:
        files += sorted(str(jar) for jar in Path(home, "jars").glob("*.jar"))
    conf = delta_spark_conf()
    files += [jar for jar in conf.get("spark.jars", "").split(",") if jar]
    for entry in conf.get("spark.driver.extraClassPath", "").split(os.pathsep):
        if entry.endswith("*"):
            files += sorted(str(jar) for jar in Path(entry[:-1]).glob("*.jar"))
    digest = hashlib.sha256()
    for name in files:
        stat = os.stat(name)
        digest.update(f"{name}\0{stat.st_size}\0{int(stat.st_mtime)}\n".encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class ArchiveLaunch:
    """How to start one driver JVM on the archive."""

    archive: str
    conf_dir: str
    """The archive's empty conf folder: `SPARK_CONF_DIR` of the spark-submit."""
    properties_file: str | None
    """The settings the usual conf folder held, for `--properties-file`."""

    def environment(self) -> dict[str, str]:
        return {"SPARK_CONF_DIR": self.conf_dir}

    def driver_java_options(self, existing: str | None = None) -> str:
        """`spark.driver.extraJavaOptions` with the archive added to the user's options."""
        return " ".join(part for part in (existing or "", f"-XX:SharedArchiveFile={self.archive}") if part)

    def submit_arguments(self) -> list[str]:
        """spark-submit options for a command line without its own properties file or
        driver Java options."""
        arguments = ["--conf", f"{DRIVER_JAVA_OPTIONS}={self.driver_java_options()}"]
        if self.properties_file:
            arguments = ["--properties-file", self.properties_file, *arguments]
        return arguments


def _conf_dir_blocker(folder: str | None) -> str | None:
    """Why the phases cannot leave `folder` off the classpath (None when they can)."""
    if folder is None or not os.path.isdir(folder):
        return None
    others = sorted(name for name in os.listdir(folder) if name != DEFAULTS_FILE)
    if others:
        return f"SPARK_CONF_DIR {folder} holds {', '.join(others[:3])}, which the driver reads from its classpath"
    return None


def archive_launch(
    environ: Mapping[str, str] = os.environ, *, properties_file: str | None = None,
) -> ArchiveLaunch | None:
    """The archive launch for this environment, or None (with the reason in the log) when
    there is no archive, it is switched off or stale, or the conf folder must stay."""
    path = archive_path(environ)
    if path is None or not os.path.exists(path):
        return None
    if not _built_for_this(path, environ):
        log.warning("the JVM archive %s was built for other jars or another Java: phases start without it; "
                    "rebuild it with `airflow-backfill jvm-archive`", path)
        return None
    conf_dir = _conf_dir(path)
    if not os.path.isdir(conf_dir) or os.listdir(conf_dir):
        log.warning("the JVM archive's conf folder %s is missing or not empty: phases start without the archive; "
                    "rebuild it with `airflow-backfill jvm-archive`", conf_dir)
        return None
    user_conf = _user_conf_dir(environ)
    blocker = _conf_dir_blocker(user_conf)
    if blocker:
        log.info("phases start without the JVM archive: %s", blocker)
        return None
    if properties_file is None and user_conf and os.path.isfile(os.path.join(user_conf, DEFAULTS_FILE)):
        properties_file = os.path.join(user_conf, DEFAULTS_FILE)
    return ArchiveLaunch(path, conf_dir, properties_file)


def archive_is_current(environ: Mapping[str, str] = os.environ) -> bool:
    """True when the archive exists and was built for these jars and this Java."""
    path = archive_path(environ)
    return path is not None and os.path.exists(path) and _built_for_this(path, environ)


def _built_for_this(path: str, environ: Mapping[str, str]) -> bool:
    """Whether the archive's manifest names the jars and Java of `environ`."""
    try:
        with open(_manifest(path)) as handle:
            built_for = json.load(handle).get("fingerprint")
    except (OSError, ValueError):
        return False
    return bool(built_for == fingerprint(environ))


def _spark_submit() -> str:
    beside = Path(sys.executable).with_name("spark-submit")
    found = str(beside) if beside.exists() else shutil.which("spark-submit")
    if not found:
        raise BackfillConfigError("spark-submit is not on PATH: install pyspark (airflow-backfill's requirements "
                                  "bring it) in this Python.")
    return found


def _warm_up_entry_point() -> str:
    spec = importlib.util.find_spec("airflow_backfill.spark_jobs.warm_up")
    if spec is None or spec.origin is None:
        raise BackfillConfigError("airflow_backfill.spark_jobs.warm_up is not installed; reinstall airflow-backfill.")
    return spec.origin


def build_archive(environ: Mapping[str, str] = os.environ, *, timeout: float = BUILD_TIMEOUT_S) -> float:
    """Write the archive: one `spark-submit` of a small snapshot and catch-up, whose JVM
    archives every class it loaded when it exits. Returns the seconds it took."""
    path = archive_path(environ)
    if path is None:
        raise BackfillConfigError(f"{ARCHIVE_VARIABLE} is '{OFF}': unset it or name a file to build the archive.")
    conf_dir = _conf_dir(path)
    user_conf = _user_conf_dir(environ)
    blocker = _conf_dir_blocker(user_conf)
    if blocker:
        raise BackfillConfigError(f"{blocker}; phases could not use an archive. Keep only {DEFAULTS_FILE} there, "
                                  "or point SPARK_CONF_DIR at such a folder.")
    os.makedirs(conf_dir, exist_ok=True)
    stray = os.listdir(conf_dir)
    if stray:
        raise BackfillConfigError(f"{conf_dir} must stay empty (it holds {stray[0]}): remove what is in it.")
    partial = f"{path}.{os.getpid()}.partial"
    launch = ArchiveLaunch(path, conf_dir, None)
    command = [_spark_submit(), "--master", "local[2]"]
    defaults = os.path.join(user_conf, DEFAULTS_FILE) if user_conf else None
    if defaults and os.path.isfile(defaults):
        command += ["--properties-file", defaults]
    for key, value in delta_spark_conf().items():
        command += ["--conf", f"{key}={value}"]
    command += ["--conf", f"spark.driver.extraJavaOptions=-XX:ArchiveClassesAtExit={partial}",
                _warm_up_entry_point()]
    started = time.monotonic()
    log.info("building the JVM archive %s (a small snapshot and catch-up in one spark-submit)", path)
    done = subprocess.run(command, env={**environ, **launch.environment()}, capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode != 0 or not os.path.exists(partial):
        if os.path.exists(partial):
            os.remove(partial)
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:])
        raise BackfillConfigError(f"the JVM archive could not be built (spark-submit exited {done.returncode}):\n{tail}")
    os.replace(partial, path)
    with open(_manifest(path), "w") as handle:
        json.dump({"fingerprint": fingerprint(environ), "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
                  handle)
    seconds = time.monotonic() - started
    log.info("built the JVM archive %s (%.0f MiB) in %.0f s", path, os.path.getsize(path) / 2**20, seconds)
    return seconds
