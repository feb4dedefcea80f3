#!/usr/bin/env bash
# Fetches pinned JVM libraries with Maven (install time only; nothing is resolved at run time):
#   jars/pom.xml              -> jars/lib               Spark's extra jars (Delta Lake, Kafka connector),
#                                                       loaded through spark.jars; jars that pyspark
#                                                       already ships (Hadoop, Parquet, Jackson, Scala...)
#                                                       are left out so one version of each class is loaded
#   jars/kafka-broker/pom.xml -> jars/kafka-broker/lib  Apache Kafka's broker for the loopback test broker,
#                                                       run with the JDK; never on Spark's classpath
#   jars/local-fs/src         -> jars/lib/airflow-backfill-local-fs.jar, compiled with the JDK's javac
#                                                       (scripts/build_local_fs.sh): Hadoop's local file
#                                                       system without the processes a commit starts
#   jars/s3/pom.xml           -> jars/s3/lib            Hadoop's S3A connector (hadoop-aws, AWS SDK v2 modules),
#                                                       loaded through spark.driver/executor.extraClassPath;
#                                                       jars that pyspark ships are left out as for jars/lib
# Each folder is skipped when it already matches its pom. Also writes jars/conf/spark-defaults.conf
# (Delta's jars, extension and catalog, the S3A classpath), which scripts/env.sh points SPARK_CONF_DIR
# at, so that a spark-submit run by hand loads them at launch too.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/debian_packages.sh

ensure_maven() {
  command -v mvn >/dev/null 2>&1 || install_debian_packages "Maven, to fetch the pinned jars" maven
}

# fetch <pom> <lib> <drop jars pyspark ships: yes|no>
fetch() {
  local pom=$1 lib=$2 drop_pyspark=$3
  local stamp="$lib/.pom.sha256" want
  want=$(sha256sum "$pom" | cut -d' ' -f1)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    echo "== $lib is up to date with $pom"
    return 0
  fi
  ensure_maven
  echo "== fetching the jars of $pom with Maven into $lib"
  rm -rf "$lib.tmp"
  mvn -q -B -f "$pom" dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$PWD/$lib.tmp"
  if [ "$drop_pyspark" = yes ]; then
    local pyspark_jars jar artifact
    pyspark_jars=$(.venv/bin/python -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
    for jar in "$lib.tmp"/*.jar; do
      artifact=$(basename "$jar" | sed -E 's/-[0-9][^-]*(-[0-9]+)?\.jar$//')
      if compgen -G "$pyspark_jars/$artifact-[0-9]*.jar" >/dev/null; then
        rm "$jar"   # pyspark ships its own version of this artifact
      fi
    done
  fi
  rm -rf "$lib"
  mv "$lib.tmp" "$lib"
  echo "$want" >"$stamp"
  echo "== $(ls "$lib"/*.jar | wc -l) jars in $lib: $(cd "$lib" && ls *.jar | tr '\n' ' ')"
}

write_spark_defaults() {
  mkdir -p jars/conf
  .venv/bin/python -c 'from airflow_backfill.engine.delta.jars import delta_spark_conf
for key, value in delta_spark_conf().items(): print(key, value)' >jars/conf/spark-defaults.conf
}

fetch jars/pom.xml jars/lib yes
bash scripts/build_local_fs.sh jars/lib
fetch jars/kafka-broker/pom.xml jars/kafka-broker/lib no
fetch jars/s3/pom.xml jars/s3/lib yes
write_spark_defaults
