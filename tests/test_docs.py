"""The docs check: the documentation cannot drift from the product.

- Every fenced `bash` block of README.md and docs/*.md is marked, on the line before its
  fence, `<!-- docs-check: run -->` or `<!-- docs-check: skip: REASON -->`.
- The `run` blocks of a page run in order, from the checkout's root, in a fresh work
  folder of the page's own (`AIRFLOW_BACKFILL_HOME`, `AIRFLOW_HOME`); a failing command
  fails the check.
- Job files the pages show load as jobs; one headed `# jobs/<file>` equals that file.
- Relative links (and their `#anchors`, headings or `<a id>` tags) lead somewhere.

What the pages name (job fields, CLI flags, `dag_run.conf` keys, round plans, commands'
output, benchmark figures) is checked against the code in tests/test_docs_code.py. How to
mark a block: docs/contributing.md.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from airflow_processes import prepare_database

from airflow_backfill.job import BackfillJob, load_job
from airflow_backfill.kafka.config import KafkaPipeline, load_kafka_pipeline

ROOT = Path(__file__).resolve().parents[1]
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
MARKER = re.compile(r"<!-- docs-check: (?:(run)|skip: (\S.*\S)) -->")
OUTPUT_MARKER = "<!-- docs-check: output -->"
"""Before a `console` block: its `$ ` commands run and print the lines shown (tests/test_docs_code.py)."""
SHELL_LANGUAGES = ("bash", "sh", "shell")
BLOCK_SECONDS = 300
"""A runnable block's limit: its commands must be bounded (small tables, --max-epochs)."""
FENCE = re.compile(r"(`{3,})(\S*)\s*")
LINK = re.compile(r"\]\(([^)\s]+)\)")


@dataclass(frozen=True)
class Block:
    """One fenced block of a page: its language, its text and the line before its fence."""

    page: Path
    line: int
    language: str
    text: str
    before: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def runs(self) -> bool:
        marker = MARKER.fullmatch(self.before)
        return marker is not None and marker.group(1) == "run"


def fenced_blocks(page: Path) -> list[Block]:
    """The page's fenced blocks; a block ends at a fence of the same backticks (so a
    four-backtick block can show a three-backtick one)."""
    lines = page.read_text().splitlines()
    blocks, index = [], 0
    while index < len(lines):
        opening = FENCE.fullmatch(lines[index])
        if opening is None:
            index += 1
            continue
        end = index + 1
        while end < len(lines) and lines[end].rstrip() != opening.group(1):
            end += 1
        before = lines[index - 1].strip() if index else ""
        blocks.append(Block(page, index + 1, opening.group(2), "\n".join(lines[index + 1:end]), before))
        index = end + 1
    return blocks


def shell_blocks(page: Path) -> list[Block]:
    return [block for block in fenced_blocks(page) if block.language in SHELL_LANGUAGES]


def test_every_shell_block_is_marked_run_or_skip_with_a_reason():
    unmarked = [f"{block.where}: the line before its fence is {block.before!r}"
                for page in PAGES for block in shell_blocks(page) if not MARKER.fullmatch(block.before)]
    assert not unmarked, ("mark each block `<!-- docs-check: run -->` or `<!-- docs-check: skip: REASON -->` "
                          "(docs/contributing.md):\n" + "\n".join(unmarked))


def console_blocks(page: Path) -> list[Block]:
    """The `console` blocks marked `<!-- docs-check: output -->`."""
    return [block for block in fenced_blocks(page) if block.language == "console" and block.before == OUTPUT_MARKER]


def test_every_marker_stands_before_a_shell_block():
    marked = {(block.page, block.line - 1) for page in PAGES for block in (*shell_blocks(page), *console_blocks(page))}
    stray = []
    for page in PAGES:
        inside = {line for block in fenced_blocks(page)
                  for line in range(block.line, block.line + block.text.count("\n") + 2)}
        for number, line in enumerate(page.read_text().splitlines(), start=1):
            if "<!-- docs-check" in line and number not in inside and (page, number) not in marked:
                stray.append(f"{page.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not stray, "markers that mark no bash block (nor an output marker a console block):\n" + "\n".join(stray)


RUNNABLE_PAGES = [page for page in PAGES if any(block.runs for block in shell_blocks(page))]


def run_block(block: Block, env: dict[str, str]) -> tuple[int, str]:
    """Run the block with bash in its own process group, which a timeout ends whole."""
    process = subprocess.Popen(["bash", "-e", "-o", "pipefail", "-c", block.text], cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=BLOCK_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        return -1, f"{output}\n(stopped after {BLOCK_SECONDS} s: bound the commands)"
    return process.returncode, output


@pytest.mark.e2e
@pytest.mark.parametrize("page", RUNNABLE_PAGES, ids=[page.name for page in RUNNABLE_PAGES])
def test_the_runnable_blocks_of_a_page_run_in_a_fresh_work_folder(page, tmp_path):
    airflow_home = tmp_path / "airflow"
    airflow_home.mkdir()
    env = {**os.environ, "AIRFLOW_HOME": str(airflow_home), "AIRFLOW_BACKFILL_HOME": str(tmp_path / "home"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    prepare_database(airflow_home / "airflow.db", env)
    for block in shell_blocks(page):
        if block.runs:
            returncode, output = run_block(block, env)
            assert returncode == 0, f"{block.where} exited {returncode}:\n{block.text}\n--- output\n{output[-4000:]}"


def job_blocks() -> list[Block]:
    """The yaml blocks that declare a job (a Delta job's `query`, or a Kafka `upstream`)."""
    blocks = []
    for page in PAGES:
        for block in fenced_blocks(page):
            if block.language == "yaml":
                data = yaml.safe_load(block.text)
                if isinstance(data, dict) and ({"query", "upstream"} & set(data)):
                    blocks.append(block)
    return blocks


def load_block(block: Block) -> BackfillJob | KafkaPipeline:
    data = yaml.safe_load(block.text)
    if "upstream" in data:
        return KafkaPipeline.from_mapping(data, origin=block.where)
    return BackfillJob.from_mapping(data, origin=block.where)


def test_the_job_files_the_pages_show_load_and_equal_the_files_they_name(monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW_BACKFILL_HOME", str(tmp_path))
    blocks = job_blocks()
    assert any(block.page.name == "README.md" for block in blocks)
    for block in blocks:
        job = load_block(block)
        named = re.match(r"# (jobs/\S+\.yaml)", block.text)
        if named:
            path = ROOT / named.group(1)
            on_disk = load_kafka_pipeline(str(path)) if isinstance(job, KafkaPipeline) else load_job(path)
            assert job == on_disk, f"{block.where} shows {named.group(1)} otherwise than the file holds"


HTML_ANCHOR = re.compile(r'<a id="([^"]+)"></a>')


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of the page's headings (lower case, punctuation dropped, spaces as
    '-') and the `<a id="...">` tags of its text (a table row's, benchmarks.md)."""
    inside = {block.line + offset for block in fenced_blocks(page) for offset in range(block.text.count("\n") + 2)}
    lines = page.read_text().splitlines()
    headings = [line.lstrip("#").strip() for number, line in enumerate(lines, start=1)
                if line.startswith("#") and number not in inside]
    tags = {tag for number, line in enumerate(lines, start=1) if number not in inside
            for tag in HTML_ANCHOR.findall(line)}
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings} | tags


def test_relative_links_lead_to_files_and_headings():
    broken = []
    for page in PAGES:
        for target in LINK.findall(page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            path_part, _, anchor = target.partition("#")
            linked = (page.parent / path_part).resolve() if path_part else page
            if not linked.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
