#!/usr/bin/env bash
# Compiles jars/local-fs (Hadoop's local file system without the `chmod` and `readlink`
# processes it starts for each Delta commit; airflow_backfill/engine/delta/commit_settings.py)
# against the Hadoop and Spark jars pyspark ships, into DIR/airflow-backfill-local-fs.jar,
# where the Delta jars are, so that spark.jars loads it with them. Install time only; skipped
# when the jar matches its sources and pyspark. Needs a JDK (javac and jar).
#   bash scripts/build_local_fs.sh [DIR]     (default jars/lib; PYTHON: the Python with pyspark)
set -euo pipefail
cd "$(dirname "$0")/.."
out_dir=${1:-jars/lib}
python=${PYTHON:-.venv/bin/python}
jar_name=airflow-backfill-local-fs.jar
pyspark_jars=$("$python" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
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
