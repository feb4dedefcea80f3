"""Only what setup.cfg cannot say: the packages, with `spark_jobs/` mapped into the package,
and the project's own jar compiled into the wheel.

The spark-submit entry points stay at the top of the checkout (`spark_jobs/`, run by hand
as `spark-submit spark_jobs/forward.py`) but are installed as `airflow_backfill.spark_jobs`,
a name no other distribution can shadow.

`airflow-backfill-local-fs.jar` (Hadoop's local file system without the processes a Delta
commit starts, `jars/local-fs`) is compiled by `scripts/build_local_fs.sh` when the wheel
is built, against the Hadoop and Spark classes of the pyspark the build's Python has (or
`$SPARK_HOME/jars`), with the JDK's javac. A build without them (an isolated build, no JDK)
says so and leaves the jar out: the engine then uses Hadoop's own classes
(`engine/delta/commit_settings.py`). `python -m build --no-isolation` from the checkout's
`.venv` has all of them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
LOCAL_FS_JAR = "airflow-backfill-local-fs.jar"


class BuildPyWithLocalFsJar(build_py):
    """The usual build, then the project's jar compiled into the built package."""

    def run(self) -> None:
        super().run()
        if self.dry_run:
            return
        target = Path(self.build_lib, "airflow_backfill", "jvm", LOCAL_FS_JAR)
        script = HERE / "scripts" / "build_local_fs.sh"
        if not script.is_file() or shutil.which("bash") is None:
            print(f"warning: {script} is missing: the wheel has no {LOCAL_FS_JAR}", file=sys.stderr)
            return
        with tempfile.TemporaryDirectory() as out:
            done = subprocess.run(["bash", str(script), out], env={**os.environ, "PYTHON": sys.executable},
                                  capture_output=True, text=True, check=False)
            built = Path(out, LOCAL_FS_JAR)
            if done.returncode != 0 or not built.is_file():
                print(f"warning: {LOCAL_FS_JAR} was not built ({(done.stderr or done.stdout).strip()}); the wheel "
                      "has none, and the engine uses Hadoop's own local file system classes", file=sys.stderr)
                return
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(built, target)


setup(
    packages=[*find_packages(include=["airflow_backfill", "airflow_backfill.*"]), "airflow_backfill.spark_jobs"],
    package_dir={"airflow_backfill.spark_jobs": "spark_jobs"},
    cmdclass={"build_py": BuildPyWithLocalFsJar},
)
