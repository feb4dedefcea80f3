"""The page in a real browser (Debian's Chromium, headless, driven by Playwright) inside
Airflow's UI: a job followed through snapshot, catch-up and forward with alters, a pause
and a resume made on the page (screenshots in light and dark mode go to docs/images/);
refused inputs store nothing; typing survives refreshes; a viewer gets no control; a
signed-out user lands on Airflow's login page."""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from airflow_server import API_JOB, BROWSER_JOB, DAG_ID, EXAMPLE_DAG_ID, job_spec
from deltalake import DeltaTable, write_deltalake

from airflow_backfill.engine import job_state
from airflow_backfill.engine.control import read_overrides, reset_overrides, write_overrides
from airflow_backfill.engine.phases.catch_up import run_catch_up
from airflow_backfill.engine.phases.forward import ForwardBounds, run_forward
from airflow_backfill.engine.phases.snapshot import run_snapshot
from airflow_backfill.engine.status import mv_commits
from airflow_backfill.job import BackfillJob

pytestmark = pytest.mark.e2e

CHROMIUM = shutil.which("chromium")
SCREENSHOTS = os.environ.get("AIRFLOW_BACKFILL_SCREENSHOTS")
"""`docs/images` when refreshing the docs' pictures
(`AIRFLOW_BACKFILL_SCREENSHOTS=docs/images bash scripts/test.sh tests/plugin/test_browser.py`)."""
FILES = 6
ROWS_PER_FILE = 20
"""At the job's 20 rows/s, each one-file chunk takes at least a second."""
CATCH_UP_EPOCHS = 3
"""Upstream epochs committed after the snapshot; catch-up applies one per round. The page
pauses it once the first round is done, while the second runs: it holds before the third."""

if CHROMIUM is None:
    pytest.skip("Chromium is missing: run scripts/install.sh", allow_module_level=True)


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """Where the screenshots go: `SCREENSHOTS`, or a folder pytest cleans up like its others."""
    folder = Path(SCREENSHOTS) if SCREENSHOTS else tmp_path_factory.mktemp("screens")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def browser() -> Iterator:
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=20_000)  # a loaded 2-core machine renders slowly
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def open_page(browser, api_server) -> Iterator[Callable]:
    """`open_page(path, user=None, dark=False)`: a page of Airflow's UI, signed in as `user`."""
    contexts = []

    def open_page(path: str, user: str | None = None, *, dark: bool = False, width: int = 1280, height: int = 900):
        context = browser.new_context(viewport={"width": width, "height": height},
                                      color_scheme="dark" if dark else "light")
        contexts.append(context)
        if user:
            context.add_cookies([{"name": "_token", "value": api_server.token(user), "url": api_server.url}])
        page = context.new_page()
        page.goto(f"{api_server.url}{path}")
        return page

    yield open_page
    for context in contexts:
        context.close()


def job_path(name: str) -> str:
    return f"/plugin/airflow-backfill/jobs/{name}"


def write_upstream(job: BackfillJob) -> None:
    for index in range(FILES):
        ids = pa.array(range(index * ROWS_PER_FILE, (index + 1) * ROWS_PER_FILE), pa.int64())
        write_deltalake(job.source, pa.table({"order_id": ids, "amount": pc.multiply(ids, 2.0)}),
                        mode="append", configuration={"delta.enableChangeDataFeed": "true"})


def update_upstream(job: BackfillJob, epoch: int) -> None:
    """One upstream epoch: 20 orders change their amount."""
    DeltaTable(job.source).update(predicate=f"order_id < {ROWS_PER_FILE}", updates={"amount": f"amount + {epoch}"})


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def in_thread(target: Callable[[], object]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            target()
        except BaseException as error:  # reported by the test thread
            errors.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


def joined(thread: threading.Thread, errors: list[BaseException]) -> None:
    thread.join(180)
    assert not thread.is_alive() and not errors, errors


def save_screenshots(pages: dict[str, object], name: str, images: Path) -> None:
    """progress_<name>_<light|dark>.png in `images`, as docs/ui.md shows them."""
    from playwright.sync_api import expect

    for mode, page in pages.items():
        expect(page.get_by_test_id("updated")).to_contain_text("Updated")
        assert page.evaluate('document.documentElement.classList.contains("dark")') == (mode == "dark")
        path = images / f"progress_{name}_{mode}.png"
        full_height_screenshot(page, path)
        assert path.stat().st_size > 10_000


def full_height_screenshot(page, path: Path) -> None:
    """Airflow's UI scrolls inside its frame: the window grows to the page's height first."""
    size = page.viewport_size
    height = page.evaluate('document.querySelector("[data-testid=backfill-progress]").scrollHeight')
    page.set_viewport_size({"width": size["width"], "height": max(size["height"], height + 140)})
    page.wait_for_timeout(300)  # the layout, the chart and badges of the latest refresh
    try:
        page.screenshot(path=str(path))
    finally:
        page.set_viewport_size(size)


@pytest.mark.spark
def test_a_job_through_its_three_phases_with_live_control(api_server, spark, open_page, images):
    from playwright.sync_api import expect

    job = BackfillJob.from_mapping(job_spec(BROWSER_JOB, api_server.tables), origin="test")
    name = job.name
    write_upstream(job)
    pages = {"light": open_page(job_path(name), "editor"), "dark": open_page(job_path(name), "editor", dark=True)}
    page = pages["light"]
    expect(page.get_by_test_id(f"job-{name}")).to_be_visible(timeout=60_000)

    # Snapshot: the progress bar grows; an alter made on the page reaches its next chunk.
    runner, errors = in_thread(lambda: run_snapshot(spark, job, chunk_bytes=1))
    expect(page.get_by_test_id(f"phase-step-{name}-snapshot")).to_have_attribute("data-state", "current", timeout=90_000)
    bar = page.get_by_test_id(f"snapshot-progress-{name}")
    seen: list[int] = []
    deadline = time.monotonic() + 90
    while len(set(seen)) < 2 and time.monotonic() < deadline:
        done = bar.get_attribute("data-done") if bar.count() else None
        if done is not None and (not seen or int(done) != seen[-1]):
            seen.append(int(done))
        time.sleep(0.2)
    assert len(set(seen)) >= 2 and seen == sorted(seen), seen
    assert seen[-1] < FILES * ROWS_PER_FILE, "the snapshot ended before the page could alter it"
    expect(page.get_by_test_id(f"snapshot-progress-{name}-label")).to_contain_text(re.compile(r"\d+(\.\d)? % · ETA"))
    page.get_by_test_id(f"parallelism-input-{name}").fill("1")
    page.get_by_test_id(f"apply-parallelism-{name}").click()
    message = page.get_by_test_id(f"message-{name}")
    expect(message).to_contain_text("Stored: backfill parallelism 1 (override)", timeout=30_000)
    expect(message).to_contain_text("Applies at the next snapshot chunk")
    expect(page.get_by_test_id(f"next-step-{name}")).to_contain_text("Next: catch-up")
    save_screenshots(pages, "snapshot", images)
    joined(runner, errors)
    expect(page.get_by_test_id(f"commits-{name}")).to_contain_text("snapshot", timeout=30_000)
    expect(page.get_by_test_id(f"snapshot-progress-{name}-label")).to_have_text("100 % · done")
    commit = mv_commits(job.target)[0]
    assert commit["phase"] == "snapshot" and commit["parallelism"] == 1
    used = commit["chunk_parallelism"]
    assert len(used) == FILES and used[0] == 2 and used[-1] == 1, used

    # Catch-up, one epoch per round: an earlier rate limit override, a pause after the
    # first round, and a resume that brings the earlier override back.
    page.get_by_test_id(f"rate-input-{name}").fill("40")
    page.get_by_test_id(f"apply-rate-{name}").click()
    expect(message).to_contain_text("rate limit 40 rows/s (override)")
    write_overrides(job.target, max_round_epochs=1)
    for epoch in range(1, CATCH_UP_EPOCHS + 1):
        update_upstream(job, epoch)
    runner, errors = in_thread(lambda: run_catch_up(spark, job))
    wait_for(lambda: len(job_state.read_state(job.target).get("catch_up_rounds") or []) >= 1, "the first round")
    page.get_by_test_id(f"pause-{name}").click()
    expect(page.get_by_test_id(f"paused-{name}")).to_be_visible()
    wait_for(lambda: job_state.read_state(job.target).get("paused_since") is not None, "catch-up to hold")
    assert read_overrides(job.target)["rate_limit"] == 0
    expect(page.get_by_test_id(f"phase-step-{name}-catch_up")).to_have_attribute("data-state", "current")
    expect(page.get_by_test_id(f"lag-chart-{name}")).to_be_visible()
    for shown in pages.values():  # the right axis' label ends within the chart, none of it cut off
        chart = shown.get_by_test_id(f"lag-chart-{name}").bounding_box()
        label = shown.get_by_test_id(f"lag-chart-seconds-{name}").bounding_box()
        assert chart and label and label["width"] > 0, (chart, label)
        assert label["x"] + label["width"] <= chart["x"] + chart["width"], (label, chart)
    save_screenshots(pages, "catch_up", images)
    page.get_by_test_id(f"resume-{name}").click()
    expect(message).to_contain_text("rate limit 40 rows/s (override)")
    assert read_overrides(job.target) == {"backfill_parallelism": 1, "rate_limit": 40, "max_round_epochs": 1}
    joined(runner, errors)
    rounds = job_state.read_state(job.target)["catch_up_rounds"]
    assert len(rounds) == CATCH_UP_EPOCHS and rounds[-1]["plan"]
    expect(page.get_by_test_id(f"rounds-{name}")).to_contain_text(rounds[-1]["plan"])  # how each round wrote

    # Forward: two more epochs, applied at the job's parallelism.
    runner, errors = in_thread(lambda: run_forward(spark, job, bounds=ForwardBounds(max_epochs=2, idle_timeout=60)))
    for epoch in range(CATCH_UP_EPOCHS + 1, CATCH_UP_EPOCHS + 3):
        update_upstream(job, epoch)
    joined(runner, errors)
    expect(page.get_by_test_id(f"phase-step-{name}-forward")).to_have_attribute("data-state", "current", timeout=30_000)
    expect(page.get_by_test_id(f"lag-epochs-{name}")).to_have_text("0 epochs")
    expect(page.get_by_test_id(f"next-step-{name}")).to_contain_text("until its task stops")
    save_screenshots(pages, "forward", images)
    reset_overrides(job.target)


@pytest.fixture
def api_target(api_server) -> Iterator[str]:
    target = str(api_server.tables / API_JOB)
    reset_overrides(target)
    yield target
    reset_overrides(target)


REFUSED_INPUTS = [
    ("parallelism", "", "Enter the backfill parallelism first."),
    ("parallelism", "two", '"two" is not a whole number'),
    ("parallelism", "-3", '"-3" is not a whole number'),
    ("parallelism", "1.5", '"1.5" is not a whole number'),
    ("parallelism", "0", "must be from 1 to 1,024, got 0"),
    ("parallelism", "2000", "must be from 1 to 1,024, got 2,000"),
    ("rate", "", "Enter the rate limit first."),
    ("rate", "1,000", '"1,000" is not a whole number: type digits only, without separators'),
    ("rate", "abc", '"abc" is not a whole number'),
    ("rate", "5 rows/s", '"5 rows/s" is not a whole number'),
    ("rate", "0", "must be from 1 to"),
]


def test_refused_inputs_say_why_and_store_nothing(open_page, api_target):
    from playwright.sync_api import expect

    page = open_page(job_path(API_JOB), "editor")
    sent: list[str] = []
    page.on("request", lambda request: request.method == "POST" and sent.append(request.url))
    for field, typed, error in REFUSED_INPUTS:
        page.get_by_test_id(f"{field}-input-{API_JOB}").fill(typed)
        page.get_by_test_id(f"apply-{field}-{API_JOB}").click()
        expect(page.get_by_test_id(f"{field}-error-{API_JOB}")).to_contain_text(error)
        page.get_by_test_id(f"{field}-input-{API_JOB}").fill("")
    assert sent == [] and read_overrides(api_target) == {}


def test_typing_survives_refreshes_and_resume_goes_back_to_the_jobs_value(open_page, api_target):
    from playwright.sync_api import expect

    page = open_page(job_path(API_JOB), "editor")
    field = page.get_by_test_id(f"rate-input-{API_JOB}")
    field.fill("12")
    updated = page.get_by_test_id("updated").inner_text()
    expect(page.get_by_test_id("updated")).not_to_have_text(updated, timeout=10_000)  # a refresh happened
    expect(field).to_have_value("12")

    page.get_by_test_id(f"pause-{API_JOB}").click()
    message = page.get_by_test_id(f"message-{API_JOB}")
    expect(message).to_contain_text("rate limit 0, paused (override)")
    expect(message).to_contain_text("Applies when the backfill of job api_orders_mv starts")
    assert read_overrides(api_target) == {"rate_limit": 0}
    expect(field).to_have_value("12")
    page.get_by_test_id(f"resume-{API_JOB}").click()
    expect(message).to_contain_text("rate limit 500 rows/s (the job's)")
    assert read_overrides(api_target) == {}


def test_a_viewer_sees_no_control(open_page):
    from playwright.sync_api import expect

    page = open_page(job_path(API_JOB), "viewer")
    expect(page.get_by_test_id(f"read-only-{API_JOB}")).to_contain_text(f"needs edit permission on DAG {DAG_ID}")
    expect(page.get_by_test_id("nav-sidebar")).to_be_visible()  # inside Airflow's frame
    assert page.get_by_role("textbox").count() == 0
    assert page.get_by_role("button", name=re.compile("Apply|Pause|Resume|Reset")).count() == 0


@pytest.mark.parametrize("path", [job_path(API_JOB), f"/airflow-backfill/jobs/{API_JOB}"])
def test_signed_out_users_land_on_the_login_page(open_page, path):
    from playwright.sync_api import expect

    page = open_page(path)
    expect(page).to_have_url(re.compile(r"/auth/login/?\?next="), timeout=30_000)
    expect(page.get_by_role("button", name=re.compile("sign in|log in|login", re.I))).to_be_visible()


def test_the_page_is_in_the_browse_menu_and_links_into_airflow(open_page, api_server):
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
    from playwright.sync_api import expect

    page = open_page("/plugin/airflow-backfill", "viewer")
    expect(page.get_by_test_id("never-ran")).to_contain_text(EXAMPLE_DAG_ID.removeprefix("example_"))
    page.get_by_role("button", name="Browse", exact=True).click()
    expect(page.get_by_role("menuitem", name="Backfill progress")).to_be_visible()
    page.keyboard.press("Escape")
    page.get_by_test_id("never-ran").get_by_role("button").click()
    link = page.get_by_test_id(f"dag-link-orders_mv-{EXAMPLE_DAG_ID}")
    dag_page = re.compile(rf"/dags/{EXAMPLE_DAG_ID}$")
    expect(link).to_have_attribute("href", dag_page)
    link.click()
    try:
        page.wait_for_url(dag_page, timeout=10_000)
    except PlaywrightTimeoutError:
        # The page refreshes its rows every few seconds; on a loaded machine a click can land
        # on a row being replaced. A link that does not navigate fails the second click too.
        link.click()
    expect(page).to_have_url(dag_page)


def test_the_job_list_sorts_and_filters_by_phase_lag_and_name(open_page):
    from playwright.sync_api import expect

    page = open_page("/plugin/airflow-backfill", "viewer")
    table = page.get_by_test_id("jobs-table")
    expect(table).to_be_visible(timeout=30_000)
    for name in (API_JOB, BROWSER_JOB, "orders_mv"):
        expect(page.get_by_test_id(f"row-{name}")).to_be_visible()
    expect(page.get_by_test_id("row-phase-orders_mv")).to_have_text("never ran")
    page.get_by_test_id("sort-jobs").select_option("name")
    first = sorted((API_JOB, BROWSER_JOB, "orders_mv"))[0]
    expect(table.locator("tbody tr").first).to_contain_text(first)
    page.get_by_test_id("filter-phase").select_option("never ran")
    expect(page.get_by_test_id("row-orders_mv")).to_be_visible()
    for view in table.locator("tbody tr").all():
        expect(view.locator("td").nth(2)).to_have_text("never ran")
    page.get_by_test_id("filter-phase").select_option("all")
    page.get_by_test_id("filter-name").fill(API_JOB)
    expect(table.locator("tbody tr")).to_have_count(1)
    expect(page.get_by_test_id(f"row-{API_JOB}")).to_be_visible()
    page.get_by_test_id(f"row-{API_JOB}").click()
    expect(page).to_have_url(re.compile(rf"/plugin/airflow-backfill/jobs/{API_JOB}$"))


def test_the_example_dags_graph(open_page, images):
    """dag_graph.png in `images`, shown by the README."""
    from playwright.sync_api import expect

    page = open_page(f"/dags/{EXAMPLE_DAG_ID}", "viewer", width=1400, height=640)
    page.evaluate('localStorage.setItem("default_dag_view", JSON.stringify("graph"))')
    page.reload()
    page.get_by_role("button", name="Collapse Details Panel").click()
    page.get_by_role("button", name="Expand all task groups").click()
    expect(page.get_by_text("wait_caught_up")).to_be_visible()
    page.get_by_role("button", name="Fit View").click()
    page.wait_for_timeout(500)
    path = images / "dag_graph.png"
    page.screenshot(path=str(path))
    assert path.stat().st_size > 10_000
