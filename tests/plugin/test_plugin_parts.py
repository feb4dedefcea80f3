"""The plugin's parts without a server: registration through the provider info, the jobs
the DAGs declare (the only addressable jobs), and the page's configuration."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

import pendulum
import pytest
from airflow.sdk import DAG

from airflow_backfill.get_provider_info import get_provider_info
from airflow_backfill.job import BackfillJob
from airflow_backfill.plugins.jobs import JobRegistry, jobs_of_dags
from airflow_backfill.plugins.page import render_page
from airflow_backfill.task_group import backfill_task_group


def make_job(name: str, root: str, query: str = "SELECT order_id, amount FROM source") -> BackfillJob:
    return BackfillJob(name=name, source=f"{root}/{name}_source", target=f"{root}/{name}", query=query,
                       primary_key=["order_id"])


def make_dag(dag_id: str, *jobs: BackfillJob) -> DAG:
    with DAG(dag_id, schedule=None, start_date=pendulum.datetime(2026, 1, 1)) as dag:
        for index, job in enumerate(jobs):
            backfill_task_group(job, group_id=f"group_{index}")
    return dag


def test_the_provider_info_registers_the_plugin_and_the_link():
    info = get_provider_info()
    [plugin] = info["plugins"]
    module, _, name = plugin["plugin-class"].rpartition(".")
    plugin_class = getattr(importlib.import_module(module), name)
    assert plugin_class.name == plugin["name"]
    assert [app["url_prefix"] for app in plugin_class.fastapi_apps] == ["/airflow-backfill"]
    for link in info["extra-links"]:
        module, _, name = link.rpartition(".")
        assert getattr(importlib.import_module(module), name)().name == "Backfill progress"


def test_airflow_loads_the_plugin_from_the_provider():
    env = {**os.environ, "AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS": "False"}
    result = subprocess.run([sys.executable, "-m", "airflow", "plugins", "--output", "json"], env=env,
                            capture_output=True, text=True, timeout=120, check=True)
    plugins = {plugin["name"]: plugin for plugin in json.loads(result.stdout)}
    assert "airflow_backfill" in plugins
    assert "/airflow-backfill" in str(plugins["airflow_backfill"]["fastapi_apps"])
    assert "'url_route': 'airflow-backfill'" in str(plugins["airflow_backfill"]["external_views"])


def test_jobs_are_indexed_by_name_with_every_dag_that_declares_them(tmp_path):
    first, second = make_job("orders_mv", str(tmp_path)), make_job("totals_mv", str(tmp_path))
    jobs = jobs_of_dags([make_dag("backfill_b", first, second), make_dag("backfill_a", first)])
    assert list(jobs) == ["orders_mv", "totals_mv"]
    assert jobs["orders_mv"].dag_ids == ("backfill_a", "backfill_b") and jobs["orders_mv"].job == first
    assert jobs["totals_mv"].dag_ids == ("backfill_b",)


def test_a_different_job_under_a_known_name_is_left_out(tmp_path, caplog):
    first = make_job("orders_mv", str(tmp_path))
    other = make_job("orders_mv", str(tmp_path), query="SELECT order_id FROM source")
    jobs = jobs_of_dags([make_dag("a", first), make_dag("b", other)])
    assert jobs["orders_mv"].job == first and jobs["orders_mv"].dag_ids == ("a",)
    assert "differs from another DAG's job" in caplog.text


def test_the_registry_parses_the_dags_again_only_after_its_ttl(tmp_path):
    now = [0.0]
    loads: list[int] = []

    def load_dags():
        loads.append(1)
        return [make_dag("a", make_job(f"job_{len(loads)}", str(tmp_path)))]

    registry = JobRegistry(load_dags, ttl=30, clock=lambda: now[0])
    assert registry.get("job_1") is not None
    now[0] = 29.0
    assert registry.get("job_1") is not None and len(loads) == 1
    now[0] = 30.0
    assert registry.get("job_1") is None and registry.get("job_2") is not None and len(loads) == 2


@pytest.mark.parametrize("job_name", [None, "orders_mv"])
def test_the_page_calls_the_routes_under_its_mount_point(job_name):
    html = render_page("/base/airflow-backfill", job_name)
    config = json.loads(html.split("const CONFIG = ", 1)[1].split(";\n", 1)[0])
    assert config == {"api": "/base/airflow-backfill/api/jobs", "job": job_name, "refresh_ms": 2000}


def test_the_page_configuration_cannot_close_its_script():
    html = render_page("", "a</script><script>alert(1)")
    assert "</script><script>alert(1)" not in html
