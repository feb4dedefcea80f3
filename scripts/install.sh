#!/usr/bin/env bash
# Sets up a fresh machine: Java 17 for Spark (when missing), a .venv with the pinned
# package and its test extras, and an Airflow home with an initialised SQLite database.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v java >/dev/null 2>&1; then
  echo "== installing the Java 17 runtime (apt-get)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless procps >/dev/null
fi

if ! command -v chromium >/dev/null 2>&1; then
  # The UI plugin's browser test drives the system's Chromium through Playwright
  # (Playwright never downloads a browser here).
  echo "== installing Chromium (apt-get)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv with $PYTHON"
  "$PYTHON" -m venv .venv
fi
echo "== installing airflow-backfill with test extras"
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'

bash scripts/fetch_jars.sh

echo "== initialising the Airflow home (.airflow, SQLite)"
source scripts/env.sh
.venv/bin/airflow db migrate >/dev/null
echo "== done: run 'scripts/test.sh' for the tests, 'scripts/demo.sh' for the demo"
