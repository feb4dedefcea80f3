#!/usr/bin/env bash
# Installs what is missing (scripts/install.sh, quick when nothing is), then lints,
# type-checks and runs the whole test suite (unit, Spark and end-to-end tests).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --for-tests
source scripts/env.sh
echo "== ruff"
ruff check airflow_backfill spark_jobs dags tests bench
echo "== mypy (package, entry points, benchmarks)"
mypy airflow_backfill spark_jobs bench
# The provider installs on the Pythons of setup.cfg's python_requires; this machine's .venv
# runs 3.11, so the others are held to by ruff's syntax checks and mypy's view of each
# version's standard library. Ruff's upgrade rules (UP) are left out: they propose syntax
# the oldest version lacks.
echo "== python versions 3.11 - 3.13 (ruff and mypy per version)"
for version in 3.11 3.12 3.13; do
  ruff check --quiet --target-version "py${version/./}" --extend-ignore UP airflow_backfill spark_jobs
  mypy --python-version "$version" --no-error-summary airflow_backfill spark_jobs
done
echo "== pytest"
# Two test processes (CI has two cores), each with its own Spark session and servers, each
# taking the next test in order when it finishes one (`--maxschedchunk 1`; by default a
# process is handed a quarter of the tests up front, so one would get every long test).
# The longest tests come first (tests/conftest.py). TEST_WORKERS=0 runs in one process.
python -m pytest -q -ra --durations=25 -n "${TEST_WORKERS:-2}" --maxschedchunk 1 "$@"
