# Sourced by the install, test and demo scripts: a self-contained Airflow home inside
# the checkout, the .venv first on PATH (spark-submit and airflow come from it) and the
# embedded Spark connection.
_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PATH="$_root/.venv/bin:$PATH"
export AIRFLOW_HOME="${AIRFLOW_HOME:-$_root/.airflow}"
export AIRFLOW__CORE__DAGS_FOLDER="${AIRFLOW__CORE__DAGS_FOLDER:-$_root/dags}"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW_BACKFILL_HOME="${AIRFLOW_BACKFILL_HOME:-$_root/.airflow_backfill}"
export AIRFLOW_CONN_SPARK_DEFAULT="${AIRFLOW_CONN_SPARK_DEFAULT:-spark://local?deploy-mode=client}"
# The Kafka connection of jobs/kafka_orders_mv.yaml: the broker `airflow-backfill kafka-demo` starts.
export AIRFLOW_CONN_KAFKA_DEFAULT="${AIRFLOW_CONN_KAFKA_DEFAULT:-{\"conn_type\": \"kafka\", \"extra\": {\"bootstrap.servers\": \"127.0.0.1:9092\"}}}"
export PYSPARK_PYTHON="$_root/.venv/bin/python"
# spark-defaults.conf with Delta's jars, extension and catalog (written by fetch_jars.sh).
export SPARK_CONF_DIR="${SPARK_CONF_DIR:-$_root/jars/conf}"
export PYSPARK_DRIVER_PYTHON="$_root/.venv/bin/python"
unset _root
export SPARK_LOCAL_IP="${SPARK_LOCAL_IP:-127.0.0.1}"
