"""The differential harness: every round path held to Spark's own results.

A process under each time zone (and, under one of them, another JVM locale and a
non-UTC `spark.sql.session.timeZone` in its Spark settings) builds and maintains MVs of
every kind over upstreams of every column type (tests/differential_run.py), once with the
default size thresholds (small rounds in the driver) and once with every driver path off
(`sizes.SPARK_EVERYWHERE`), each incremental round taking the next write way. This test
process then compares every version of every MV with Spark's recompute of its query at the
upstream versions that version records (tests/spark_oracle.py).
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
    "UTC": {},
    "America/New_York": {},
    "Asia/Kolkata": {"locale": ("de", "DE"), "session_zone": "Asia/Kolkata"},
}
WAYS = {"merge", "replace", "delete", "overwrite", "append"}
RUN_TIMEOUT_S = 900


def run_in_zone(work: Path, zone: str, locale: tuple[str, str] | None = None, session_zone: str | None = None) -> dict:
    """Run the harness's engine process under `zone` (and a JVM locale, and a session time
    zone in its Spark settings); its manifest."""
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
    done = subprocess.run([sys.executable, str(RUNNER), str(work)], env=env, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, f"the harness run under {zone} failed:\n{done.stderr[-6000:]}"
    return json.loads((work / "manifest.json").read_text())


@pytest.mark.parametrize("zone", sorted(ZONES))
def test_every_mv_version_equals_sparks_recompute(spark, tmp_path, zone):
    manifest = run_in_zone(tmp_path, zone, **ZONES[zone])
    problems, checked = [], 0
    for run in manifest["runs"]:
        assert WAYS <= {way for _, way in run["ways"]}, (run["policy"], run["ways"])
        assert {("recompute", "difference"), ("recompute", "overwrite")} <= {tuple(w) for w in run["ways"]}, run
        for name, mv in run["mvs"].items():
            upstreams = mv["sources"] or {"source": mv["source"]}
            found = differences(spark, mv["target"], mv["app_id"], mv["query"], upstreams)
            problems += [f"{run['policy']} {name}: {problem}" for problem in found]
            checked += len(mv_versions(mv["target"], mv["app_id"], upstreams))
    assert not problems, f"under TZ={zone}, {len(problems)} differences:\n" + "\n".join(problems)
    assert checked >= 2 * 6 * 8, checked  # two size policies, six MVs, a snapshot and seven rounds each
