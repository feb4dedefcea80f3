"""`airflow-backfill jars fetch`: resolve the pinned jars once, with Maven, into their folders.

`mvn dependency:copy-dependencies` on the pom shipped in the package, into a partial folder
renamed into place when complete, so a run that fails or is interrupted leaves no half
folder behind. Artifacts pyspark already ships (Hadoop, Parquet, Jackson, Scala...) are
left out of the Spark and S3A sets, so that one version of each class is loaded. A set
whose folder was fetched for the same pom and pyspark is left as it is.
"""

from __future__ import annotations

import glob
import logging
import os
import re
import shutil
import subprocess
from pathlib import Path

from airflow_backfill.exceptions import BackfillConfigError
from airflow_backfill.jvm.libraries import STAMP, JarSet, pyspark_jars_dir

log = logging.getLogger(__name__)

MAVEN_TIMEOUT_S = 1800.0
_VERSION_SUFFIX = re.compile(r"-[0-9][^-]*(-[0-9]+)?\.jar$")


def fetch(jar_set: JarSet, *, force: bool = False) -> str:
    """Fetch one set unless its folder is current; returns what was done, for the terminal."""
    folder = jar_set.folder()
    if folder is None:
        return f"{jar_set.name}: provided by Spark ({jar_set.option} = provided), nothing to fetch"
    if not force and jar_set.is_current(folder):
        return f"{jar_set.name}: {folder} is up to date"
    maven = shutil.which("mvn")
    if maven is None:
        raise BackfillConfigError(
            "Maven (mvn) is not on PATH: install it (Debian: apt-get install maven) and run the command again; "
            f"it resolves the pinned coordinates of {jar_set.pom.name} once, into {folder}.")
    partial = f"{folder}.{os.getpid()}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    log.info("fetching the %s jars (%s) with Maven into %s", jar_set.what, jar_set.pom.name, folder)
    command = [maven, "-q", "-B", "-f", str(jar_set.pom), "dependency:copy-dependencies", "-DincludeScope=runtime",
               f"-DoutputDirectory={partial}"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=MAVEN_TIMEOUT_S)
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
            raise BackfillConfigError(f"Maven could not fetch the {jar_set.what} jars (exit {done.returncode}):\n{tail}")
        left_out = _drop_pyspark_artifacts(partial) if jar_set.skip_pyspark_jars else []
        Path(partial, STAMP).write_text(jar_set.fetched_for())
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(os.path.dirname(folder), exist_ok=True)
        os.replace(partial, folder)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    jars = sorted(os.path.basename(jar) for jar in glob.glob(os.path.join(folder, "*.jar")))
    dropped = f" ({len(left_out)} left out: pyspark ships them)" if left_out else ""
    return f"{jar_set.name}: {len(jars)} jars in {folder}{dropped}"


def _drop_pyspark_artifacts(folder: str) -> list[str]:
    """Remove the jars whose artifact pyspark ships in another (or the same) version."""
    pyspark_jars = pyspark_jars_dir()
    if pyspark_jars is None:
        raise BackfillConfigError("pyspark is not installed in this Python: install airflow-backfill's requirements "
                                  "first (the fetched jars leave out what pyspark ships).")
    dropped = []
    for jar in sorted(glob.glob(os.path.join(folder, "*.jar"))):
        artifact = _VERSION_SUFFIX.sub("", os.path.basename(jar))
        if glob.glob(os.path.join(glob.escape(pyspark_jars), f"{glob.escape(artifact)}-[0-9]*.jar")):
            os.remove(jar)
            dropped.append(os.path.basename(jar))
    return dropped
