"""Parsing an example DAG file stays cheap: the DAG processor parses every file again and
again, so the provider must not load delta-rs, pyarrow, sqlglot or Spark at parse time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

DAGS = sorted((Path(__file__).resolve().parents[2] / "dags").glob("example_*.py"))
HEAVY = ("deltalake", "pyarrow", "sqlglot", "pyspark", "pandas", "delta")
BUDGET_SECONDS = 0.5

# What the DAG processor has loaded before it parses a file: Airflow's task SDK.
PARSE = """
import json, runpy, sys, time
import airflow.sdk
started = time.perf_counter()
runpy.run_path(sys.argv[1])
elapsed = time.perf_counter() - started
print(json.dumps({"seconds": elapsed, "heavy": [m for m in sys.argv[2:] if m in sys.modules]}))
"""


def parse(dag_file: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", PARSE, str(dag_file), *HEAVY],
                          capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("dag_file", DAGS, ids=lambda path: path.stem)
def test_parsing_an_example_dag_imports_nothing_heavy_and_stays_under_budget(dag_file):
    first = parse(dag_file)
    assert first["heavy"] == [], f"parsing {dag_file.name} imported {first['heavy']}"
    # best of two fresh interpreters: one slow start on a busy machine is not a regression
    seconds = first["seconds"] if first["seconds"] <= BUDGET_SECONDS else min(first["seconds"], parse(dag_file)["seconds"])
    assert seconds <= BUDGET_SECONDS, f"parsing {dag_file.name} took {seconds:.2f} s of imports (budget {BUDGET_SECONDS} s)"
