"""The example DAG with its tables on the loopback S3 server: `airflow dags test
example_orders_mv` runs snapshot, catch-up and forward as spark-submit tasks while a
simulator writes the upstream on S3, credentials coming only from an Airflow `aws`
connection. The MV equals the query recomputed independently at every commit's
watermark, and the secret key appears in no process's command line, no log line, no
file of the Airflow home (its database holds XCom and rendered fields)."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from airflow_processes import ROOT, prepare_database, run_airflow
from helpers_delta import mv_commits

from airflow_backfill.engine.delta.log import latest_version, table_exists
from oracle import assert_every_commit_matches

pytestmark = pytest.mark.e2e

QUERY = ("SELECT order_id, customer_id, status, amount * quantity AS total, updated_at "
         "FROM source WHERE status <> 'cancelled'")
AWS_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION",
                 "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ALLOW_HTTP")


class CommandLineWatch:
    """Reads every process's command line a few times a second, noting any with `secret`."""

    def __init__(self, secret: str) -> None:
        self.secret = secret
        self.seen: list[str] = []
        self.scans = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CommandLineWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            for process in psutil.process_iter(["cmdline"]):
                command = " ".join(process.info.get("cmdline") or [])
                if self.secret in command:
                    self.seen.append(command[:300])
            self.scans += 1


def test_the_example_dag_on_s3_keeps_the_secret_out_of_commands_and_logs(tmp_path, s3, monkeypatch):
    bucket = s3.new_bucket()
    home = f"s3://{bucket}/demo"
    airflow_home = tmp_path / "airflow"
    airflow_home.mkdir()
    env = {key: value for key, value in os.environ.items() if key not in AWS_VARIABLES}
    env.update({
        "AIRFLOW_BACKFILL_HOME": home, "AIRFLOW_BACKFILL_AWS_CONN_ID": "lake",
        "AIRFLOW_CONN_LAKE": s3.connection_json(),
        "AIRFLOW_HOME": str(airflow_home), "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
    })
    prepare_database(airflow_home / "airflow.db", env)

    # The upstream's writer has its own credentials, in its environment.
    for variable, value in {**s3.settings().environment(), "AWS_ALLOW_HTTP": "true"}.items():
        monkeypatch.setenv(variable, value)
    simulator_log = tmp_path / "simulator.log"
    with open(simulator_log, "w") as output:
        simulator = psutil.Popen(
            [str(Path(sys.executable).with_name("airflow-backfill")), "simulate", "--table", f"{home}/orders",
             "--rows", "2000", "--epoch-interval", "2", "--inserts", "20", "--updates", "30", "--deletes", "10",
             "--seed", "5"], stdout=output, stderr=output)
    try:
        deadline = time.monotonic() + 60
        while not (table_exists(f"{home}/orders") and latest_version(f"{home}/orders") >= 1):
            assert simulator.poll() is None, simulator_log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the simulator did not create the upstream on S3"
            time.sleep(0.5)
        with CommandLineWatch(s3.secret_access_key) as watch:
            run = run_airflow("dags", "test", "example_orders_mv", env=env, timeout=900)
    finally:
        simulator.terminate()
        simulator.wait(timeout=60)

    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-6000:]
    assert watch.scans > 10 and watch.seen == [], watch.seen[:3]
    assert s3.secret_access_key not in output
    for path in airflow_home.rglob("*"):
        if path.is_file():
            assert s3.secret_access_key.encode() not in path.read_bytes(), f"the secret is in {path}"

    source, target = f"{home}/orders", f"{home}/orders_mv"
    phases = [commit["airflow_backfill.phase"] for commit in mv_commits(target)]
    assert phases[0] == "snapshot" and phases[-1] == "forward", phases
    checked = assert_every_commit_matches(source, target, QUERY, "airflow_backfill/orders_mv", key=["order_id"])
    assert checked == len(phases)
