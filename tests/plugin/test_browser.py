"""The page in a real browser (Debian's Chromium, headless, driven by Playwright) against
the API server while a snapshot runs: the phase and a growing snapshot fraction show,
an alter made on the page reaches the snapshot's commit, and a screenshot is saved."""

from __future__ import annotations

import re
import shutil
import threading
import time

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from airflow_server import BROWSER_JOB, job_spec
from deltalake import write_deltalake

from airflow_backfill.engine.phases.snapshot import run_snapshot
from airflow_backfill.engine.status import mv_commits
from airflow_backfill.job import BackfillJob

pytestmark = [pytest.mark.e2e, pytest.mark.spark]

CHROMIUM = shutil.which("chromium")
FILES = 10
ROWS_PER_FILE = 20
"""At the job's 20 rows/s, each one-file chunk takes at least a second."""


def write_upstream(job: BackfillJob) -> None:
    for index in range(FILES):
        ids = pa.array(range(index * ROWS_PER_FILE, (index + 1) * ROWS_PER_FILE), pa.int64())
        write_deltalake(job.source, pa.table({"order_id": ids, "amount": pc.multiply(ids, 2.0)}),
                        mode="append", configuration={"delta.enableChangeDataFeed": "true"})


def rows_done(text: str) -> int | None:
    match = re.fullmatch(r"(\d+) / (\d+)", text.strip())
    return int(match.group(1)) if match else None


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is missing: run scripts/install.sh")
def test_the_page_follows_a_running_snapshot_and_alters_it(api_server, spark, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    job = BackfillJob.from_mapping(job_spec(BROWSER_JOB, api_server.tables), origin="test")
    write_upstream(job)
    errors: list[BaseException] = []

    def snapshot() -> None:
        try:
            run_snapshot(spark, job, chunk_bytes=1)
        except BaseException as error:  # reported by the test thread
            errors.append(error)

    runner = threading.Thread(target=snapshot, daemon=True)
    screenshot = tmp_path / "backfill_progress.png"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            context = browser.new_context(viewport={"width": 1200, "height": 1400})
            context.add_cookies([{"name": "_token", "value": api_server.token("editor"), "url": api_server.url}])
            page = context.new_page()
            runner.start()
            page.goto(f"{api_server.url}/airflow-backfill/jobs/{BROWSER_JOB}")
            expect(page.get_by_test_id(f"phase-{BROWSER_JOB}")).to_have_text("snapshot", timeout=90_000)

            seen: list[int] = []
            deadline = time.monotonic() + 90
            fraction = page.get_by_test_id(f"snapshot-rows-{BROWSER_JOB}")
            while len(set(seen)) < 2 and time.monotonic() < deadline:
                done = rows_done(fraction.inner_text()) if fraction.count() else None
                if done is not None and (not seen or done != seen[-1]):
                    seen.append(done)
                time.sleep(0.2)
            assert len(set(seen)) >= 2 and seen == sorted(seen), seen
            assert seen[-1] < FILES * ROWS_PER_FILE, "the snapshot ended before the page could alter it"
            expect(fraction).to_have_text(re.compile(rf"\d+ / {FILES * ROWS_PER_FILE}"))

            page.get_by_test_id(f"parallelism-input-{BROWSER_JOB}").fill("1")
            page.get_by_test_id(f"apply-parallelism-{BROWSER_JOB}").click()
            expect(page.get_by_test_id(f"message-{BROWSER_JOB}")).to_contain_text(
                "applies at the next snapshot chunk", timeout=30_000)

            runner.join(180)
            assert not runner.is_alive() and not errors, errors
            expect(page.get_by_test_id(f"commits-{BROWSER_JOB}")).to_contain_text("snapshot", timeout=30_000)
            expect(page.get_by_test_id(f"parallelism-{BROWSER_JOB}")).to_contain_text("1 (job: 2)")
            page.screenshot(path=str(screenshot), full_page=True)
        finally:
            browser.close()
    print(f"screenshot: {screenshot}")
    assert screenshot.stat().st_size > 0

    commit = mv_commits(job.target)[0]
    assert commit["phase"] == "snapshot" and commit["parallelism"] == 1
    used = commit["chunk_parallelism"]
    assert len(used) == FILES and used[0] == 2 and used[-1] == 1, used
