#!/usr/bin/env bash
# Fetches the pinned JVM libraries of jars/pom.xml into jars/lib with Maven (install time
# only; Spark never resolves packages at run time). Jars that pyspark already ships (Spark's
# own Hadoop, Parquet, Jackson, Scala...) are left out so that one version of each class is
# on the classpath. Skipped when jars/lib already matches the pom. Also writes
# jars/conf/spark-defaults.conf (Delta's jars, extension and catalog), which scripts/env.sh
# points SPARK_CONF_DIR at, so that a spark-submit run by hand loads Delta at launch too.
set -euo pipefail
cd "$(dirname "$0")/.."
pom=jars/pom.xml
lib=jars/lib
stamp="$lib/.pom.sha256"
want=$(sha256sum "$pom" | cut -d' ' -f1)
write_spark_defaults() {
  mkdir -p jars/conf
  .venv/bin/python -c 'from airflow_backfill.engine.delta.jars import delta_spark_conf
for key, value in delta_spark_conf().items(): print(key, value)' >jars/conf/spark-defaults.conf
}
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  write_spark_defaults
  echo "== jars/lib is up to date with $pom"
  exit 0
fi
if ! command -v mvn >/dev/null 2>&1; then
  echo "== installing Maven (apt-get)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq maven >/dev/null
fi
pyspark_jars=$(.venv/bin/python -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
echo "== fetching the jars of $pom with Maven into $lib"
rm -rf "$lib.tmp"
mvn -q -B -f "$pom" dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$PWD/$lib.tmp"
for jar in "$lib.tmp"/*.jar; do
  artifact=$(basename "$jar" | sed -E 's/-[0-9][^-]*(-[0-9]+)?\.jar$//')
  if compgen -G "$pyspark_jars/$artifact-[0-9]*.jar" >/dev/null; then
    rm "$jar"   # pyspark ships its own version of this artifact
  fi
done
rm -rf "$lib"
mv "$lib.tmp" "$lib"
echo "$want" >"$stamp"
write_spark_defaults
echo "== $(ls "$lib"/*.jar | wc -l) jars in $lib: $(cd "$lib" && ls *.jar | tr '\n' ' ')"
