"""The differential harness: every round path held to Spark's own results.

The engine builds and maintains MVs over upstreams of every column type
(tests/differential_run.py) under each time zone (and, under one of them, another JVM
locale and a non-UTC `spark.sql.session.timeZone` in its Spark settings):

- New York (daylight saving, and local mean time before 1883: where local-time mistakes
  show first), in this test process with its Python moved to New York (where the driver
  paths turn rows into values; the engine keeps every JVM in UTC wherever it runs): the
  stateless MV of every column, the aggregate, the MV over the aggregate, the LEFT join
  and the grouped join, with the default size thresholds (small rounds in the driver);
  every write way taken;
- Kolkata (a half-hour offset), a process of its own started under that zone, with
  another JVM locale and the Spark settings a phase runs with (the tests' shared session
  turns Spark's code generation off to save time): the stateless MV with a WHERE and
  zone-dependent expressions;
- UTC, in this test process (its Python moved to UTC): the aggregate (its netting and
  folding in Spark, over every type) with every driver path off
  (`sizes.SPARK_EVERYWHERE`), so the fast paths also run on the other side of their
  thresholds; joins read wholly through Spark run in tests/test_join_leave_arrive.py.

The suite's time bounds the matrix, not the harness: `python tests/differential_run.py
WORK --sizes default,spark` runs all six MVs under both policies. Each incremental round
takes a write way not taken yet. This test process then compares every version of every
MV with Spark's recompute of its query at the upstream versions that version records
(tests/spark_oracle.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from deltalake import DeltaTable
from differential_run import SEED, run_policies
from process_zone import python_in_zone
from spark_oracle import check_manifest

pytestmark = [pytest.mark.spark, pytest.mark.e2e]

RUNNER = Path(__file__).resolve().parent / "differential_run.py"
ZONES = {
    "America/New_York": {"sizes": "default", "mvs": "everything,grouped,over_grouped,joined,joined_grouped",
                         "here": True},
    "UTC": {"sizes": "spark", "mvs": "grouped", "here": True},
    "Asia/Kolkata": {"sizes": "default", "mvs": "computed",
                     "locale": ("de", "DE"), "session_zone": "Asia/Kolkata"},
}
WAYS = {"merge", "patch", "replace", "delete", "overwrite", "append"}
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
    if session_zone is not None:  # and the settings a phase runs with: Spark's generated code on
        conf = work / "spark-conf"
        conf.mkdir(parents=True)
        defaults = Path(os.environ["INSTALLED_SPARK_CONF_DIR"], "spark-defaults.conf").read_text()
        (conf / "spark-defaults.conf").write_text(f"{defaults}spark.sql.session.timeZone {session_zone}\n")
        env["SPARK_CONF_DIR"] = str(conf)
    command = [sys.executable, str(RUNNER), str(work), "--sizes", sizes, *(["--mvs", mvs] if mvs else [])]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, f"the harness run under {zone} failed:\n{done.stderr[-6000:]}"
    return json.loads((work / "manifest.json").read_text())


def committed_ways(target: str) -> set[str]:
    """The write ways an MV's commits record: each round's plan, or the way each of its
    tables (an aggregate's state and MV) was written."""
    ways: set[str] = set()
    for entry in DeltaTable(target).history():
        plan = json.loads(json.loads(entry.get("userMetadata") or "{}").get("airflow_backfill.plan", "{}"))
        ways |= set((plan.get("writes") or {}).values()) | ({plan.get("plan")} & WAYS)
    return ways


def run_here(spark, work: Path, zone: str, sizes: str, mvs: str) -> dict:
    """The harness in this process's session: no JVM of its own to start and warm up."""
    with python_in_zone(zone):
        return run_policies(spark, str(work), sizes.split(","), SEED, mvs.split(","))


@pytest.mark.parametrize("zone", sorted(ZONES))
def test_every_mv_version_equals_sparks_recompute(spark, tmp_path, zone):
    settings = dict(ZONES[zone])
    if settings.pop("here", False):
        manifest = run_here(spark, tmp_path, zone, **settings)
    else:
        manifest = run_in_zone(tmp_path, zone, **settings)
    for run in manifest["runs"]:
        if "everything" in run["mvs"]:  # with the other MVs of its kind, it takes every write way
            written = set().union(*(committed_ways(mv["target"]) for mv in run["mvs"].values()))
            assert WAYS <= written, (run["policy"], written)
        recomputes = {way for kind, way in run["ways"] if kind == "recompute"}
        # One recompute round per MV, alternating: a run of one MV writes its difference.
        assert recomputes == ({"difference", "overwrite"} if len(run["mvs"]) > 1 else {"difference"}), run
    problems, checked = check_manifest(spark, manifest)
    assert not problems, f"under TZ={zone}, {len(problems)} differences:\n" + "\n".join(problems)
    mvs = sum(len(run["mvs"]) for run in manifest["runs"])
    assert checked >= mvs * 7, checked  # a snapshot and six rounds each
