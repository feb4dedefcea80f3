#!/usr/bin/env bash
# Lint, type-check and run the whole test suite (unit, Spark and end-to-end tests).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
echo "== ruff"
ruff check airflow_backfill spark_jobs dags tests bench
echo "== mypy (package)"
mypy airflow_backfill spark_jobs
echo "== pytest"
python -m pytest -q -ra "$@"
