#!/usr/bin/env bash
# Sets up a machine, or does nothing when it already is: a Java 17 JDK for Spark (when missing),
# a .venv with the package, its test, demo, openlineage and s3 extras at the tested versions
# (constraints-3.11.txt), the Delta and S3A jars, and an Airflow home with an initialised SQLite
# database. The demo and test scripts run it first, so it must stay fast when nothing is missing.
# Only the Debian packages need root (scripts/debian_packages.sh: sudo when not root, or a
# message naming them); everything else lands in the checkout and the user's caches.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/debian_packages.sh

missing=()
# A JDK, not only a runtime: scripts/build_local_fs.sh compiles jars/local-fs with its javac.
{ command -v java && command -v javac && command -v jar; } >/dev/null 2>&1 || missing+=(openjdk-17-jdk-headless procps)
# The UI plugin's browser test drives the system's Chromium through Playwright (Playwright
# never downloads a browser here).
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
# The many-MV end-to-end test runs Airflow's metadata database on PostgreSQL
# (tests/postgres.py starts a server of its own on 127.0.0.1; the demo keeps SQLite).
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || missing+=(postgresql)
if [ ${#missing[@]} -gt 0 ]; then
  install_debian_packages "Java 17 for Spark, Chromium for the UI's browser test, PostgreSQL for the many-MV test" \
    "${missing[@]}"
fi

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv with $PYTHON"
  "$PYTHON" -m venv .venv
fi
# The Python packages are reinstalled only when what decides them changed.
stamp=.venv/.airflow_backfill-install
want=$(cat setup.cfg setup.py pyproject.toml constraints-3.11.txt | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "== .venv is up to date with setup.cfg and constraints-3.11.txt"
else
  echo "== installing airflow-backfill with its test, demo, openlineage and s3 extras (constraints-3.11.txt)"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -c constraints-3.11.txt -e '.[test,demo,openlineage,s3]'
  echo "$want" >"$stamp"
fi

bash scripts/fetch_jars.sh

source scripts/env.sh
if [ ! -f "$AIRFLOW_HOME/airflow.db" ] || [ "$stamp" -nt "$AIRFLOW_HOME/airflow.db" ]; then
  echo "== initialising the Airflow home ($AIRFLOW_HOME, SQLite)"
  .venv/bin/airflow db migrate >/dev/null
fi
# A class-data-sharing archive of the classes a phase's driver loads: each spark-submit then
# starts seconds sooner (airflow_backfill/engine/launch/class_archive.py). Built once, about a minute,
# and again only when Java or the jars change.
if ! airflow-backfill --log-level WARNING jvm-archive --if-stale; then
  echo "== the JVM archive could not be built (above): phases start without it"
fi
echo "== ready: 'bash scripts/test.sh' runs the tests, 'bash scripts/demo.sh' the demo"
