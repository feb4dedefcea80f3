#!/usr/bin/env bash
# The demo: a live `orders` upstream committing an epoch every second, a full backfill
# through `airflow dags test example_orders_mv`, then the job's status and a check of the
# MV against the query recomputed independently (DuckDB) at the MV's watermark.
# Installs what is missing first (scripts/install.sh, quick when nothing is).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
source scripts/env.sh
home="$AIRFLOW_BACKFILL_HOME"
echo "== tables live in $home (AIRFLOW_BACKFILL_HOME); starting from scratch"
rm -rf "$home/orders" "$home/orders_mv"
mkdir -p "$home"

airflow-backfill simulate --table "$home/orders" --rows 50000 --epoch-interval 1 \
  --inserts 50 --updates 100 --deletes 20 --seed 1 >"$home/simulator.log" 2>&1 &
simulator=$!
trap 'kill -TERM $simulator 2>/dev/null || true' EXIT
for _ in $(seq 60); do [ -d "$home/orders/_delta_log" ] && break; sleep 1; done
echo "== upstream is live (simulator pid $simulator, log $home/simulator.log)"

echo "== airflow dags test example_orders_mv"
if ! airflow dags test example_orders_mv >"$home/dags_test.log" 2>&1; then
  tail -n 60 "$home/dags_test.log"; echo "airflow dags test failed (full log: $home/dags_test.log)"; exit 1
fi
# The phases' progress lines, as "time module: message" (Airflow wraps each line of the
# spark-submit output in its own log record).
progress='^.*\] [0-9-]+ ([0-9:]+),[0-9]+ [A-Z]+ airflow_backfill\.engine\.phases\.([a-z_]+): (.*) \[airflow\..*$'
if ! grep -E "$progress" "$home/dags_test.log" | sed -E "s/$progress/\1 \2: \3/" | tail -n 40 | grep .; then
  echo "no progress of the phases in $home/dags_test.log: its log format changed"; exit 1
fi

kill -TERM $simulator; wait $simulator || true
trap - EXIT
echo "== status"
airflow-backfill status --job jobs/orders_mv.yaml
echo "== check"
python tests/oracle.py --job jobs/orders_mv.yaml
