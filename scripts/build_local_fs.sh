#!/usr/bin/env bash
# Compiles jars/local-fs (Hadoop's local file system without the `chmod` and `readlink`
# processes it starts for each Delta commit; airflow_backfill/engine/delta/commit_settings.py)
# against the Hadoop and Spark jars pyspark ships, into DIR/airflow-backfill-local-fs.jar.
# The wheel build runs it (setup.py) to ship the jar in the package; scripts/install.sh runs
# it into airflow_backfill/jvm for the checkout's editable install. Skipped when the jar
# matches its sources and pyspark. Needs a JDK (javac and jar).
#   bash scripts/build_local_fs.sh [DIR]     (default airflow_backfill/jvm; PYTHON: the Python
#                                             with pyspark, else $SPARK_HOME/jars)
set -euo pipefail
cd "$(dirname "$0")/.."
out_dir=$(mkdir -p "${1:-airflow_backfill/jvm}" && cd "${1:-airflow_backfill/jvm}" && pwd)
python=${PYTHON:-.venv/bin/python}
jar_name=airflow-backfill-local-fs.jar
if pyspark_jars=$("$python" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))' 2>/dev/null); then
  :
elif [ -n "${SPARK_HOME:-}" ] && [ -d "$SPARK_HOME/jars" ]; then
  pyspark_jars=$SPARK_HOME/jars
else
  echo "scripts/build_local_fs.sh: neither $python has pyspark nor SPARK_HOME names a Spark with jars/" >&2
  exit 1
fi
sources=$(find jars/local-fs/src -name '*.java' | sort)
stamp="$out_dir/.local-fs.sha256"
want=$( (cat $sources; ls "$pyspark_jars") | sha256sum | cut -d' ' -f1)
if [ -f "$out_dir/$jar_name" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "== $out_dir/$jar_name is up to date with jars/local-fs"
  exit 0
fi
if ! command -v javac >/dev/null 2>&1 || ! command -v jar >/dev/null 2>&1; then
  echo "scripts/build_local_fs.sh: javac and jar are missing: install a JDK 17 (Debian: openjdk-17-jdk-headless)" >&2
  exit 1
fi
echo "== compiling jars/local-fs into $out_dir/$jar_name"
classes=$(mktemp -d)
trap 'rm -rf "$classes"' EXIT
javac -nowarn -Xlint:-path --release 17 -cp "$pyspark_jars/*" -d "$classes" $sources
mkdir -p "$out_dir"
jar --create --file "$out_dir/$jar_name.tmp" -C "$classes" .
mv "$out_dir/$jar_name.tmp" "$out_dir/$jar_name"
echo "$want" >"$stamp"
