"""The wheel is the whole provider: built from the checkout (through its sdist), installed
into a new virtualenv in a temporary folder and run from a working folder elsewhere, it
imports, answers its commands, finds its jars, and Airflow finds its plugin, its settings
and its `spark-submit` entry points, with no file of the checkout on the way; a DAG of a
job file beside it runs a whole backfill (`airflow dags test`) whose MV equals its query
at its watermark.

The new virtualenv has no system site-packages and no checkout on `sys.path`; the
provider's requirements come from the checkout's `.venv` through a folder of links to its
site-packages that leaves the provider's own editable install out (installing Airflow and
Spark again would take minutes and the network). The wheel itself goes in with `--no-deps`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest
from deltalake import DeltaTable

from oracle import assert_every_commit_matches

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
JOB = """name: orders_mv
source: lake/orders
target: lake/orders_mv
query: SELECT order_id, status FROM source WHERE status <> 'cancelled'
primary_key: [order_id]
"""
TEST_HELPERS = ("conftest.py", "oracle.py", "helpers_delta.py", "airflow_processes.py", "kafka_fixtures.py")


DAG_FILE = """
import pendulum
from airflow.sdk import DAG

from airflow_backfill.task_group import backfill_task_group

with DAG("wheel_orders_mv", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")):
    backfill_task_group("../jobs/lake_orders_mv.yaml", forward_idle_timeout=1)
"""


def run(command: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """The sdist and the wheel built from it, as `python -m build` makes them."""
    out = tmp_path_factory.mktemp("dist")
    built = run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)], cwd=out,
                env={**os.environ, "PYTHON": sys.executable}, timeout=600)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def installed(dist, tmp_path_factory) -> dict:
    """A new virtualenv with the wheel, away from the checkout."""
    place = tmp_path_factory.mktemp("elsewhere")
    venv = place / "venv"
    created = run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=place, env=dict(os.environ))
    assert created.returncode == 0, created.stderr
    python = venv / "bin" / "python"
    site_packages = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             cwd=place, env=dict(os.environ)).stdout.strip())
    requirements = place / "requirements"
    requirements.mkdir()
    for entry in Path(sysconfig.get_path("purelib")).iterdir():
        if "airflow_backfill" not in entry.name:
            (requirements / entry.name).symlink_to(entry)
    (site_packages / "requirements.pth").write_text(f"import site; site.addsitedir({str(requirements)!r})\n")
    [wheel] = dist.glob("*.whl")
    pip = run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
               str(wheel)], cwd=place, env=dict(os.environ))
    assert pip.returncode == 0, pip.stdout + pip.stderr
    work = place / "work"
    (work / "jobs").mkdir(parents=True)
    (work / "jobs" / "orders_mv.yaml").write_text(JOB)
    (work / "jobs" / "top5.yaml").write_text(JOB.replace("orders_mv", "top5").replace(
        "SELECT order_id", "SELECT DISTINCT order_id").replace("'cancelled'", "'cancelled' LIMIT 5"))
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("AIRFLOW", "SPARK_CONF_DIR", "PYTHONPATH", "VIRTUAL_ENV"))}
    # pyspark's own launch scripts (spark-submit) live in its package, a requirement like any other
    spark_bin = Path(sysconfig.get_path("purelib")) / "pyspark" / "bin"
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{spark_bin}{os.pathsep}/usr/local/bin:/usr/bin:/bin",
               AIRFLOW_HOME=str(place / "airflow"),
               AIRFLOW__CORE__LOAD_EXAMPLES="False", PYSPARK_PYTHON=str(python), PYSPARK_DRIVER_PYTHON=str(python))
    return {"venv": venv, "python": python, "site_packages": site_packages, "work": work, "env": env}


def test_the_wheel_holds_the_page_the_jar_and_the_pins_and_no_test_helper(dist):
    [wheel] = dist.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "airflow_backfill/plugins/static/backfill_progress.js" in names
    assert {"airflow_backfill/jvm/poms/spark.xml", "airflow_backfill/jvm/poms/s3a.xml",
            "airflow_backfill/jvm/poms/kafka-broker.xml"} <= set(names)
    assert "airflow_backfill/jvm/airflow-backfill-local-fs.jar" in names  # a JDK and pyspark were there
    assert "airflow_backfill/spark_jobs/forward.py" in names
    assert not [name for name in names if name.startswith(("tests/", "bench/", "dags/", "jars/"))
                or name.rsplit("/", 1)[-1] in TEST_HELPERS]
    entry_points = next(zipfile.ZipFile(wheel).read(name).decode() for name in names
                        if name.endswith(".dist-info/entry_points.txt"))
    assert "[airflow.plugins]" in entry_points and "[apache_airflow_provider]" in entry_points
    [sdist] = dist.glob("*.tar.gz")
    members = tarfile.open(sdist).getnames()
    assert any(name.endswith("jars/local-fs/src/airflowbackfill/localfs/ShellFreeRawLocalFs.java") for name in members)
    assert not any(name.endswith(".jar") for name in members)


def test_every_module_imports_from_the_new_virtualenv(installed):
    probe = """
import importlib, json, pkgutil, sys
import airflow_backfill
modules = [info.name for info in pkgutil.walk_packages(airflow_backfill.__path__, "airflow_backfill.")]
files = {name: importlib.import_module(name).__file__ for name in modules}
print(json.dumps({"files": files, "path": sys.path}))
"""
    done = run([str(installed["python"]), "-c", probe], cwd=installed["work"], env=installed["env"])
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(found["files"]) > 100
    assert all(file.startswith(str(installed["site_packages"])) for file in found["files"].values())
    assert {"airflow_backfill.spark_jobs.forward", "airflow_backfill.plugins.progress", "airflow_backfill.cli",
            "airflow_backfill.operators.phases", "airflow_backfill.triggers.lag"} <= set(found["files"])
    assert not [entry for entry in found["path"] if entry.startswith(str(ROOT))]


def test_the_command_checks_jobs_and_finds_its_jars(installed):
    cli = str(installed["venv"] / "bin" / "airflow-backfill")
    work, env = installed["work"], installed["env"]
    assert run([cli, "--help"], work, env).returncode == 0
    good = run([cli, "check", "--job", "jobs/orders_mv.yaml"], work, env)
    assert good.returncode == 0 and good.stdout.strip() == "jobs/orders_mv.yaml: ok", good.stdout + good.stderr
    bad = run([cli, "check", "--jobs-in", "jobs"], work, env)
    assert bad.returncode == 1 and "top5.yaml: DISTINCT" in bad.stdout
    conf = run([cli, "jars", "conf"], work, env)
    if conf.returncode != 0:  # this machine's cache has no jars: the error names the command
        assert "run `airflow-backfill jars fetch` once" in conf.stderr
        return
    jars = dict(line.split(" ", 1) for line in conf.stdout.splitlines())["spark.jars"].split(",")
    assert str(installed["site_packages"] / "airflow_backfill" / "jvm" / "airflow-backfill-local-fs.jar") in jars
    assert not [jar for jar in jars if jar.startswith(str(ROOT))]


def test_airflow_finds_the_provider_its_settings_its_plugin_and_its_entry_points(installed):
    python, work, env = str(installed["python"]), installed["work"], installed["env"]
    value = run([python, "-m", "airflow", "config", "get-value", "airflow_backfill", "lease_seconds"], work, env)
    assert value.returncode == 0 and value.stdout.strip() == "60", value.stderr[-2000:]
    plugins = run([python, "-m", "airflow", "plugins", "--output", "json"], work, env)
    assert plugins.returncode == 0, plugins.stderr[-2000:]
    assert "airflow_backfill" in {plugin["name"] for plugin in json.loads(plugins.stdout)}
    probe = """
import importlib.metadata as m, importlib.util as u, json
from airflow.providers_manager import ProvidersManager
providers = ProvidersManager().providers
print(json.dumps({
    "provider": providers["airflow-backfill"].version if "airflow-backfill" in providers else None,
    "plugin": [str(e.dist._path) for e in m.entry_points(group="airflow.plugins") if e.name == "airflow_backfill"],
    "forward": u.find_spec("airflow_backfill.spark_jobs.forward").origin,
}))
"""
    done = run([python, "-c", probe], work, env)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["provider"] == "0.1.0"
    assert len(found["plugin"]) == 1 and found["plugin"][0].startswith(str(installed["site_packages"]))
    assert found["forward"] == str(installed["site_packages"] / "airflow_backfill" / "spark_jobs" / "forward.py")


def test_a_dag_of_a_job_file_runs_a_whole_backfill_from_the_wheel(installed):
    """pin_epoch, snapshot, catch-up and forward: each phase's spark-submit runs the entry
    point installed in the new virtualenv, with the jars of the cache and the wheel's own."""
    python, work, env = str(installed["python"]), installed["work"], dict(installed["env"])
    lake = work / "lake"
    env.update(AIRFLOW_BACKFILL_HOME=str(lake), AIRFLOW__CORE__DAGS_FOLDER=str(work / "dags"),
               AIRFLOW_CONN_SPARK_DEFAULT="spark://local?deploy-mode=client")
    (work / "jobs" / "lake_orders_mv.yaml").write_text(JOB.replace("lake/", "${AIRFLOW_BACKFILL_HOME}/"))
    (work / "dags").mkdir(exist_ok=True)
    (work / "dags" / "wheel_orders_mv.py").write_text(DAG_FILE)
    cli = str(installed["venv"] / "bin" / "airflow-backfill")
    if run([cli, "jars", "fetch", "--check"], work, env).returncode != 0:
        pytest.skip("this machine's cache has no jars (`airflow-backfill jars fetch` needs Maven Central)")
    simulated = run([cli, "simulate", "--table", str(lake / "orders"), "--rows", "300", "--epoch-interval", "0",
                     "--max-epochs", "3"], work, env)
    assert simulated.returncode == 0, simulated.stderr[-2000:]
    migrated = run([python, "-m", "airflow", "db", "migrate"], work, env, timeout=600)
    assert migrated.returncode == 0, migrated.stderr[-2000:]
    dag_run = run([python, "-m", "airflow", "dags", "test", "wheel_orders_mv"], work, env, timeout=900)
    output = dag_run.stdout + dag_run.stderr
    assert dag_run.returncode == 0, output[-6000:]
    assert str(installed["site_packages"] / "airflow_backfill" / "spark_jobs" / "snapshot.py") in output
    # No file of the checkout was named, only its .venv's requirements (pyspark, Airflow).
    assert re.findall(re.escape(str(ROOT)) + r"/(?!\.venv/)\S+", output) == []

    watermark = DeltaTable(str(lake / "orders_mv")).transaction_version("airflow_backfill/orders_mv")
    assert watermark == 3  # the simulator's last epoch
    query = "SELECT order_id, status FROM source WHERE status <> 'cancelled'"
    assert assert_every_commit_matches(str(lake / "orders"), str(lake / "orders_mv"), query,
                                       "airflow_backfill/orders_mv", key=["order_id"]) >= 1
