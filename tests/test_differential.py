"""The differential harness: every round path held to Spark's own results.

A process under each time zone (and, under one of them, another JVM locale and a
non-UTC `spark.sql.session.timeZone` in its Spark settings) builds and maintains MVs over
upstreams of every column type (tests/differential_run.py) with the default size
thresholds, small rounds in the driver. Under New York it builds all six kinds of MV, and
again with every driver path off (`sizes.SPARK_EVERYWHERE`), so each path runs on both
sides of its threshold; under UTC and Kolkata three kinds each, together all six (the
suite's time is bounded: New York, an offset with daylight saving and local mean time
before 1883, is where local-time mistakes show first).
Each incremental round takes a write way not taken yet. This test process then compares
every version of every MV with Spark's recompute of its query at the upstream versions that
version records (tests/spark_oracle.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from spark_oracle import differences, mv_versions

pytestmark = [pytest.mark.spark, pytest.mark.e2e]

RUNNER = Path(__file__).resolve().parent / "differential_run.py"
ZONES = {
    "UTC": {"sizes": "default", "mvs": "everything,grouped,joined"},
    "America/New_York": {"sizes": "default,spark"},
    "Asia/Kolkata": {"sizes": "default", "mvs": "computed,grouped,over_grouped,joined_grouped",
                     "locale": ("de", "DE"), "session_zone": "Asia/Kolkata"},
}
WAYS = {"merge", "replace", "delete", "overwrite", "append"}
RUN_TIMEOUT_S = 900


def run_in_zone(work: Path, zone: str, sizes: str, mvs: str | None = None, locale: tuple[str, str] | None = None,
                session_zone: str | None = None) -> dict:
    """Run the harness's engine process under `zone` for the size policies `sizes` and the
    MVs `mvs` (all when None), and a JVM locale, and a session time zone in its Spark
    settings; its manifest."""
    env = {**os.environ, "TZ": zone}
    if locale is not None:
        language, country = locale
        env["JAVA_TOOL_OPTIONS"] = f"{env.get('JAVA_TOOL_OPTIONS', '')} -Duser.language={language} " \
                                   f"-Duser.country={country}".strip()
    if session_zone is not None:
        conf = work / "spark-conf"
        conf.mkdir(parents=True)
        defaults = Path(os.environ["SPARK_CONF_DIR"], "spark-defaults.conf").read_text()
        (conf / "spark-defaults.conf").write_text(f"{defaults}spark.sql.session.timeZone {session_zone}\n")
        env["SPARK_CONF_DIR"] = str(conf)
    command = [sys.executable, str(RUNNER), str(work), "--sizes", sizes, *(["--mvs", mvs] if mvs else [])]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, f"the harness run under {zone} failed:\n{done.stderr[-6000:]}"
    return json.loads((work / "manifest.json").read_text())


@pytest.mark.parametrize("zone", sorted(ZONES))
def test_every_mv_version_equals_sparks_recompute(spark, tmp_path, zone):
    manifest = run_in_zone(tmp_path, zone, **ZONES[zone])
    problems, checked = [], 0
    for run in manifest["runs"]:
        if len(run["mvs"]) == 6:  # every kind of MV: every write way taken
            assert WAYS <= {way for _, way in run["ways"]}, (run["policy"], run["ways"])
        for name, mv in run["mvs"].items():
            upstreams = mv["sources"] or {"source": mv["source"]}
            found = differences(spark, mv["target"], mv["app_id"], mv["query"], upstreams)
            problems += [f"{run['policy']} {name}: {problem}" for problem in found]
            checked += len(mv_versions(mv["target"], mv["app_id"], upstreams))
    assert not problems, f"under TZ={zone}, {len(problems)} differences:\n" + "\n".join(problems)
    mvs = sum(len(run["mvs"]) for run in manifest["runs"])
    assert checked >= mvs * 8, checked  # a snapshot and seven rounds each
