"""A relative job path in a DAG file names a file beside the DAG file, whatever folder
Airflow parses it from: the README's DAG, copied into a DAG folder with its job file in
`jobs/` beside it, loads the same job from any working directory."""

from __future__ import annotations

from pathlib import Path

import pendulum
from airflow.sdk import DAG
from readme_dag import readme_deployment

from airflow_backfill.job import load_job
from airflow_backfill.job_input import as_job
from airflow_backfill.task_group import backfill_task_group

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_dag_reads_its_job_beside_it_from_another_working_directory(tmp_path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("AIRFLOW_BACKFILL_HOME", str(tmp_path / "home"))
    dags = readme_deployment(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # no jobs/ here: a path resolved against the cwd would fail
    bag = DagBag(dag_folder=str(dags))
    assert bag.import_errors == {}
    snapshot = bag.get_dag("orders_mv").get_task("orders_mv.snapshot")
    assert snapshot.job == load_job(dags / "jobs" / "orders_mv.yaml")
    assert snapshot.job == load_job(ROOT / "jobs" / "orders_mv.yaml")  # the README shows the repository's job


def test_a_relative_path_resolves_beside_the_calling_file_not_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW_BACKFILL_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)  # holds no jobs/ folder
    here = Path(__file__).parent
    relative = Path("..", "..", "jobs", "orders_mv.yaml")
    assert as_job(str(relative)) == load_job(here / relative)
    with DAG("r", schedule=None, start_date=pendulum.datetime(2026, 1, 1)) as dag:
        backfill_task_group(str(relative))
    assert dag.get_task("orders_mv.forward").job == load_job(ROOT / "jobs" / "orders_mv.yaml")
    assert as_job(ROOT / "jobs" / "orders_mv.yaml").name == "orders_mv"  # absolute paths as given
