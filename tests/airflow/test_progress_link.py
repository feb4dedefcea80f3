"""The "Backfill progress" extra link of every phase: the job's page, under the API
server's base path, from the operator's job (Airflow evaluates links in the worker)."""

from __future__ import annotations

import pytest

from airflow_backfill.links.progress import BackfillProgressLink, job_page_path
from airflow_backfill.operators.phases import (
    ForwardOperator,
    LogStoreCatchUpOperator,
    SnapshotBackfillOperator,
)


@pytest.mark.parametrize("operator_class", [SnapshotBackfillOperator, LogStoreCatchUpOperator, ForwardOperator])
def test_every_phase_links_to_its_job_page(operator_class, job):
    operator = operator_class(task_id="phase", job=job)
    links = [link for link in operator.operator_extra_links if isinstance(link, BackfillProgressLink)]
    assert len(links) == 1 and links[0].name == "Backfill progress"
    assert links[0].get_link(operator, ti_key=None) == "/plugin/airflow-backfill/jobs/orders_mv"


def test_the_link_keeps_the_api_servers_base_path(monkeypatch):
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example.com/team-a/")
    assert job_page_path("orders.v2") == "/team-a/plugin/airflow-backfill/jobs/orders.v2"


def test_an_operator_without_a_job_has_no_link():
    class NoJob:
        pass

    assert BackfillProgressLink().get_link(NoJob(), ti_key=None) == ""  # type: ignore[arg-type]
