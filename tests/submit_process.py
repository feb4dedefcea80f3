"""spark-submit command lines and environments of the tests' phase processes: on the JVM
class archive when `airflow-backfill jvm-archive` built one (as the phase operators start
them), otherwise as before."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from airflow_backfill.engine.launch.class_archive import ArchiveLaunch, archive_launch

ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def _launch() -> ArchiveLaunch | None:
    return archive_launch()


def spark_submit(entry_point: str, *args: str, master: str = "local[2]", options: tuple[str, ...] = ()) -> list[str]:
    """The command of `spark_jobs/<entry_point>.py` with spark-submit `options` before it."""
    launch = _launch()
    return [str(Path(sys.executable).with_name("spark-submit")), "--master", master,
            *(launch.submit_arguments() if launch else []), *options,
            str(ROOT / "spark_jobs" / f"{entry_point}.py"), *args]


def submit_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) with the archive's conf folder, for `spark_submit`."""
    launch = _launch()
    return {**(os.environ if env is None else env), **(launch.environment() if launch else {})}
