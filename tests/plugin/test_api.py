"""The plugin's routes on a real API server: authentication (401), DAG permissions
(viewer reads, 403 on alter; editor alters), validation (400 with a message), unknown
jobs (404), the same numbers as `airflow-backfill status --json`, and jobs found in the
metadata database: no DAG file is imported, however many there are."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

import pytest
import yaml
from airflow_server import API_JOB, BROWSER_JOB, DAG_ID, EXAMPLE_DAG_ID, PLAIN_DAG_FILES

from airflow_backfill.engine.control import read_overrides, reset_overrides
from airflow_backfill.simulator import create_orders_table

pytestmark = pytest.mark.e2e


@pytest.fixture
def api_target(api_server):
    target = str(api_server.tables / API_JOB)
    reset_overrides(target)
    yield target
    reset_overrides(target)


@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/api/jobs"), ("GET", f"/api/jobs/{API_JOB}"), ("POST", f"/api/jobs/{API_JOB}/alter"),
])
def test_anonymous_requests_are_refused_with_401(api_server, method, path):
    with api_server.client(None) as client:
        response = client.request(method, path, json={"backfill_parallelism": 1})
    assert response.status_code == 401, response.text


@pytest.mark.parametrize(("path", "location"), [
    ("/", "/plugin/airflow-backfill"), (f"/jobs/{API_JOB}", f"/plugin/airflow-backfill/jobs/{API_JOB}"),
])
def test_the_old_page_addresses_open_the_page_in_airflows_ui(api_server, path, location):
    with api_server.client(None) as client:
        response = client.get(path)
    assert response.status_code == 302 and response.headers["location"] == location


def test_the_page_script_is_served_as_javascript(api_server):
    with api_server.client(None) as client:
        response = client.get("/static/backfill_progress.js")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/javascript")
    assert "globalThis.AirflowPlugin" in response.text


def test_a_forged_token_is_refused(api_server):
    with api_server.client(None) as client:
        response = client.get("/api/jobs", headers={"Authorization": "Bearer not.a.token"})
    assert response.status_code in (401, 403)


def test_the_viewer_reads_every_job_of_the_dags(api_server):
    with api_server.client("viewer") as client:
        listing = client.get("/api/jobs")
    assert listing.status_code == 200
    jobs = {view["name"]: view for view in listing.json()["jobs"]}
    assert set(jobs) == {API_JOB, BROWSER_JOB, "orders_mv"}
    assert jobs[API_JOB]["dag_ids"] == [DAG_ID] and jobs["orders_mv"]["dag_ids"] == [EXAMPLE_DAG_ID]
    assert {task["task_id"] for task in jobs[API_JOB]["tasks"]} == {
        f"api.{task}" for task in ("pin_epoch", "snapshot", "catch_up", "wait_caught_up", "forward")}
    assert jobs[API_JOB]["status"]["control"]["job_backfill_parallelism"] == 2
    assert jobs[API_JOB]["can_edit"] is False


def test_no_dag_file_is_imported_and_requests_stay_fast_with_many_dag_files(api_server):
    """The jobs come from the serialized DAGs: the API server imports none of the DAG
    folder's files (each would record it and fail), so a request costs the same with
    one DAG file or many."""
    with api_server.client("editor") as client:
        assert client.get("/api/jobs").status_code == 200
        seconds = []
        for _ in range(5):
            started = time.perf_counter()
            assert client.get(f"/api/jobs/{API_JOB}").status_code == 200
            seconds.append(time.perf_counter() - started)
        assert client.post(f"/api/jobs/{API_JOB}/alter", json={"reset": True}).status_code == 200
    assert PLAIN_DAG_FILES >= 40 and api_server.dag_imports() == []
    assert statistics.median(seconds) < 1.0, seconds


def test_the_viewer_cannot_alter(api_server, api_target):
    with api_server.client("viewer") as client:
        response = client.post(f"/api/jobs/{API_JOB}/alter", json={"backfill_parallelism": 1})
    assert response.status_code == 403
    assert DAG_ID in response.json()["detail"]
    assert read_overrides(api_target) == {}


def test_the_editor_alters_pauses_resumes_and_resets(api_server, api_target):
    with api_server.client("editor") as client:
        assert client.get(f"/api/jobs/{API_JOB}").json()["can_edit"] is True
        altered = client.post(f"/api/jobs/{API_JOB}/alter", json={"backfill_parallelism": 3})
        assert altered.status_code == 200, altered.text
        assert altered.json()["after"] == {"backfill_parallelism": 3, "rate_limit": 500, "altered": True,
                                           "paused": False}
        assert altered.json()["stored"] == {"backfill_parallelism": 3} == read_overrides(api_target)
        assert altered.json()["message"].startswith(f"applies when the backfill of job {API_JOB} starts")
        capped = client.post(f"/api/jobs/{API_JOB}/alter", json={"rate_limit": 40})
        assert capped.json()["stored"] == {"backfill_parallelism": 3, "rate_limit": 40}
        paused = client.post(f"/api/jobs/{API_JOB}/alter", json={"rate_limit": 0})
        assert paused.status_code == 200 and paused.json()["after"]["paused"] is True
        status = client.get(f"/api/jobs/{API_JOB}").json()["status"]
        assert status["control"]["paused"] is True and status["control"]["backfill_parallelism"] == 3
        resumed = client.post(f"/api/jobs/{API_JOB}/alter", json={"resume": True})
        assert resumed.json()["action"] == "resume" and resumed.json()["after"]["rate_limit"] == 40
        assert read_overrides(api_target) == {"backfill_parallelism": 3, "rate_limit": 40}
        again = client.post(f"/api/jobs/{API_JOB}/alter", json={"resume": True})
        assert again.status_code == 400 and "not paused" in again.json()["detail"]
        lifted = client.post(f"/api/jobs/{API_JOB}/alter", json={"rate_limit": None})
        assert lifted.json()["after"]["rate_limit"] is None
        reset = client.post(f"/api/jobs/{API_JOB}/alter", json={"reset": True})
    assert reset.status_code == 200 and reset.json()["after"]["altered"] is False
    assert reset.json()["stored"] == {} == read_overrides(api_target)


@pytest.mark.parametrize(("body", "message"), [
    ({"backfill_parallelism": 0}, "backfill_parallelism must be between 1 and 1024"),
    ({"backfill_parallelism": "4"}, "backfill_parallelism must be an integer"),
    ({"backfill_parallelism": True}, "backfill_parallelism must be an integer"),
    ({"rate_limit": -5}, "rate_limit must be between 1 and"),
    ({"rate_limit": 2.5}, "rate_limit must be an integer"),
    ({"rate_limit": "1,000"}, "rate_limit must be an integer"),
    ({"rate_limit": ""}, "rate_limit must be an integer"),
    ({"backfill_parallelism": None}, "backfill_parallelism must be an integer"),
    ({"parallelism": 4}, "unknown field(s) parallelism"),
    ({}, "nothing to alter"),
    ({"reset": True, "rate_limit": 5}, "cannot be combined with rate_limit"),
    ({"reset": "yes"}, "reset can only be true"),
    ({"resume": True}, "not paused"),
    ([1, 2], "must be a JSON object"),
])
def test_bad_values_are_400_with_a_message(api_server, api_target, body, message):
    with api_server.client("editor") as client:
        response = client.post(f"/api/jobs/{API_JOB}/alter", json=body)
    assert response.status_code == 400, response.text
    assert message in response.json()["detail"]
    assert read_overrides(api_target) == {}


def test_a_body_that_is_not_json_is_refused(api_server, api_target):
    with api_server.client("editor") as client:
        form = client.post(f"/api/jobs/{API_JOB}/alter", data={"backfill_parallelism": "2"})
        broken = client.post(f"/api/jobs/{API_JOB}/alter", content=b"{",
                             headers={"Content-Type": "application/json"})
    assert form.status_code == 415
    assert broken.status_code == 400 and "not valid JSON" in broken.json()["detail"]


@pytest.mark.parametrize("name", ["no_such_job", "%2E%2E%2Fetc%2Fpasswd", "orders_mv.yaml"])
def test_a_job_no_dag_declares_is_404(api_server, name):
    with api_server.client("editor") as client:
        for response in (client.get(f"/api/jobs/{name}"),
                         client.post(f"/api/jobs/{name}/alter", json={"backfill_parallelism": 1})):
            assert response.status_code == 404, (response.request.url, response.text)


def test_the_page_shows_the_numbers_of_status_json(api_server, tmp_path):
    """One structure for both: what the API returns is what the CLI prints."""
    source = str(api_server.tables / f"{API_JOB}_source")
    create_orders_table(source, rows=30, seed=3)
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump({
        "name": API_JOB, "source": source, "target": str(api_server.tables / API_JOB),
        "query": "SELECT order_id, amount FROM source", "primary_key": ["order_id"],
        "backfill_parallelism": 2, "parallelism": 1, "rate_limit": 500,
    }))
    with api_server.client("viewer") as client:
        from_api = client.get(f"/api/jobs/{API_JOB}").json()["status"]
    cli = subprocess.run([sys.executable, "-m", "airflow_backfill.cli", "status", "--job", str(job_file), "--json"],
                         capture_output=True, text=True, check=True, timeout=120)
    from_cli = json.loads(cli.stdout)
    assert from_api["upstream_version"] == 0
    assert from_api == from_cli
