#!/usr/bin/env bash
# Sets up a machine, or does nothing when it already is: a Java 17 JDK for Spark (when missing),
# a .venv with the package, its test, demo, openlineage and s3 extras at the tested versions
# (constraints-3.11.txt), the pinned jars (`airflow-backfill jars fetch`, the command a
# deployment runs), the project's own jar, and an Airflow home with an initialised SQLite
# database. The demo and test scripts run it first, so it must stay fast when nothing is missing.
#   bash scripts/install.sh               what the demo needs
#   bash scripts/install.sh --for-tests   and what the tests need besides: Chromium (the UI's browser
#                                         test), PostgreSQL (the many-MV test), Kafka's broker jars
# Only the Debian packages need root (scripts/debian_packages.sh: sudo when not root, or a
# message naming them); everything else lands in the checkout and the user's caches.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/debian_packages.sh

for_tests=no
case "${1:-}" in
  --for-tests) for_tests=yes ;;
  "") ;;
  *) echo "usage: bash scripts/install.sh [--for-tests]" >&2; exit 2 ;;
esac

read -r -a missing <<<"$(missing_debian_packages "$([ "$for_tests" = yes ] && echo --for-tests)")"
if [ ${#missing[@]} -gt 0 ]; then
  install_debian_packages "Java 17 for Spark$([ "$for_tests" = yes ] && echo ", Chromium and PostgreSQL for the tests")" \
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

# The pinned jars, the way a deployment gets them: Maven coordinates resolved once into the
# user's cache (~/.cache/airflow-backfill), never at run time. Maven only when a fetch is due.
jar_sets=()
[ "$for_tests" = yes ] && jar_sets+=(--kafka-broker)
if ! .venv/bin/airflow-backfill --log-level WARNING jars fetch --check "${jar_sets[@]}" >/dev/null; then
  command -v mvn >/dev/null 2>&1 || install_debian_packages "Maven, to fetch the pinned jars" maven
  .venv/bin/airflow-backfill --log-level WARNING jars fetch "${jar_sets[@]}"
fi
# The project's own jar, in the package folder the editable install reads (a wheel build
# compiles its own copy: setup.py).
PYTHON=.venv/bin/python bash scripts/build_local_fs.sh airflow_backfill/jvm
# spark-defaults.conf with the jars, Delta's extension and catalog and the S3A classpath, which
# scripts/env.sh points SPARK_CONF_DIR at, so that a spark-submit run by hand loads them too.
mkdir -p jars/conf
.venv/bin/airflow-backfill --log-level WARNING jars conf >jars/conf/spark-defaults.conf.tmp
mv jars/conf/spark-defaults.conf.tmp jars/conf/spark-defaults.conf

source scripts/env.sh
if [ ! -f "$AIRFLOW_HOME/airflow.db" ] || [ "$stamp" -nt "$AIRFLOW_HOME/airflow.db" ]; then
  echo "== initialising the Airflow home ($AIRFLOW_HOME, SQLite)"
  .venv/bin/airflow db migrate >/dev/null
fi
# A class-data-sharing archive of the classes a phase's driver loads: each spark-submit then
# starts seconds sooner (airflow_backfill/engine/launch/class_archive.py). Built once, about a minute,
# and again only when Java or the jars change; the phases start without it when it is missing.
if ! airflow-backfill --log-level WARNING jvm-archive --if-stale; then
  echo "== the JVM archive could not be built (above): phases start without it"
fi
echo "== ready: 'bash scripts/test.sh' runs the tests, 'bash scripts/demo.sh' the demo"
