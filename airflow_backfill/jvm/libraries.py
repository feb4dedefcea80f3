"""Where each set of pinned jars lives: the provider's cache, unless a setting names a folder.

A set's folder is named by the provider's version and a digest of its pom, so two
installs with different pins never share a folder; a stamp inside records what it was
fetched for (the pom and the pyspark whose own jars were left out).
"""

from __future__ import annotations

import glob
import hashlib
import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from airflow_backfill import __version__
from airflow_backfill.config import PROVIDED, cache_dir, setting

POMS = Path(__file__).resolve().parent / "poms"
LOCAL_FS_JAR = "airflow-backfill-local-fs.jar"
"""The jar the wheel build compiles from `jars/local-fs` (scripts/build_local_fs.sh)."""
STAMP = ".fetched-for"
FETCH_COMMAND = "airflow-backfill jars fetch"


@dataclass(frozen=True)
class JarSet:
    """One pom's jars."""

    name: str
    pom: Path
    option: str
    """The `[airflow_backfill]` option that may name another folder."""
    marker: str
    """A glob of a jar the set always holds: how a folder is recognised as this set."""
    skip_pyspark_jars: bool
    """Leave out the artifacts pyspark ships, so one version of each class is loaded."""
    what: str

    def pom_digest(self) -> str:
        return hashlib.sha256(self.pom.read_bytes()).hexdigest()

    def default_folder(self, environ: Mapping[str, str] | None = None) -> str:
        return os.path.join(cache_dir(environ), "jars", __version__, f"{self.name}-{self.pom_digest()[:12]}")

    def folder(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The folder the jars are read from; None when the setting says `provided`."""
        configured = setting(self.option, environ)
        if configured == PROVIDED:
            return None
        return os.path.abspath(os.path.expanduser(configured)) if configured else self.default_folder(environ)

    def jars(self, environ: Mapping[str, str] | None = None) -> list[str]:
        folder = self.folder(environ)
        return sorted(glob.glob(os.path.join(folder, "*.jar"))) if folder else []

    def present(self, environ: Mapping[str, str] | None = None) -> bool:
        folder = self.folder(environ)
        return folder is None or bool(glob.glob(os.path.join(folder, self.marker)))

    def fetched_for(self) -> str:
        """What the stamp of a current folder says: this pom, and pyspark's jars when left out."""
        return f"pom {self.pom_digest()}\npyspark {pyspark_jars_signature() if self.skip_pyspark_jars else '-'}\n"

    def is_current(self, folder: str) -> bool:
        stamp = Path(folder, STAMP)
        return stamp.is_file() and stamp.read_text() == self.fetched_for()

    def missing_message(self, environ: Mapping[str, str] | None = None) -> str:
        """The error when the set is needed and its folder holds none of it: names the command."""
        folder = self.folder(environ)
        fetch = FETCH_COMMAND + (" --kafka-broker" if self is KAFKA_BROKER else "")
        provided = f", or to '{PROVIDED}' when Spark already has them" if self is not KAFKA_BROKER else ""
        return (f"no {self.what} jars in {folder}: run `{fetch}` once (it resolves the pinned Maven coordinates "
                f"into that folder), or set the option [airflow_backfill] {self.option} (environment variable "
                f"AIRFLOW_BACKFILL_{self.option.upper()}) to a folder holding them{provided}.")


SPARK = JarSet("spark", POMS / "spark.xml", "jars_dir", "delta-spark_*.jar", True,
               "Delta Lake (and Spark's Kafka connector)")
S3A = JarSet("s3a", POMS / "s3a.xml", "s3a_jars_dir", "hadoop-aws-*.jar", True, "Hadoop S3A")
KAFKA_BROKER = JarSet("kafka-broker", POMS / "kafka-broker.xml", "kafka_broker_jars", "kafka_2.13-*.jar", False,
                      "Apache Kafka broker")
JAR_SETS = (SPARK, S3A, KAFKA_BROKER)


def pyspark_jars_dir() -> str | None:
    """The jars folder of the installed pyspark (None without pyspark)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        return None
    return os.path.join(os.path.dirname(spec.origin), "jars")


def pyspark_jars_signature() -> str:
    """The names of pyspark's own jars: what a set that leaves them out depends on."""
    folder = pyspark_jars_dir()
    names = sorted(os.listdir(folder)) if folder and os.path.isdir(folder) else []
    return hashlib.sha256("\n".join(names).encode()).hexdigest()


def local_fs_jar() -> str | None:
    """The project's own jar shipped beside this module (None when the wheel was built
    without a JDK: the engine then uses Hadoop's own classes, `commit_settings`)."""
    path = Path(__file__).resolve().parent / LOCAL_FS_JAR
    return str(path) if path.is_file() else None
