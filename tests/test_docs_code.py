"""The docs check, second part: what README.md and docs/*.md name agrees with the code.

- Job fields: docs/jobs.md's job file names every `BackfillJob` field, and a field shown
  inline with a value (`round_plan: merge`) is a field that takes that value.
- CLI flags: every `--flag` after a project command (`airflow-backfill alter`,
  `spark-submit spark_jobs/snapshot.py`, `python bench/run.py`, `python -m
  airflow_backfill.tpch load`) is an option of that command's parser.
- `dag_run.conf`: the keys docs/airflow.md allows are the ones the overrides accept, and
  every `--conf '{...}'` shown is accepted.
- Round plans: the ways docs/round-plans.md lists and the choices it offers are the
  planner's; a `round_plan` value shown anywhere is one of them.
- Output: a `console` block marked `<!-- docs-check: output -->` runs each `$ ` command
  from the checkout's root and must print the lines shown, in order.
- Figures: the generated parts of the benchmark pages and the README equal what
  `bench/table.py` makes of `bench/results/`; a figure quoted elsewhere is a link to its
  row (`[1.26 s](benchmarks.md#round-q1)`) and appears in that row's figure; a ratio
  (`2.3x`) outside such a link fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_docs import PAGES, ROOT, console_blocks, fenced_blocks

from airflow_backfill.engine.planning.round_plan import RECOMPUTE, ROUND_PLAN_CHOICES, WRITES
from airflow_backfill.exceptions import BackfillConfigError
from airflow_backfill.job import BackfillJob
from airflow_backfill.overrides import ALLOWED_KEYS, validate_overrides

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import table  # noqa: E402

BENCHMARK_PAGES = ("benchmarks.md", "benchmark-history.md", "benchmark-analyses.md")
"""Pages of figures: the table, the runs and the dated investigations (exempt from the ratio rule)."""
INLINE_CODE = re.compile(r"``?([^`\n]+?)``?")
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
JOBS_PAGE = ROOT / "docs" / "jobs.md"


def text_without_blocks(page: Path) -> str:
    """The page's prose: its fenced blocks blanked out (their lines kept, so numbers hold)."""
    lines = page.read_text().splitlines()
    for block in fenced_blocks(page):
        for index in range(block.line - 1, block.line + block.text.count("\n") + 1):
            if index < len(lines):
                lines[index] = ""
    return "\n".join(lines)


def inline_spans(page: Path) -> Iterator[tuple[str, str]]:
    """(where, text) of every inline code span of the page's prose."""
    name = str(page.relative_to(ROOT))
    for number, line in enumerate(text_without_blocks(page).splitlines(), start=1):
        for span in INLINE_CODE.findall(line):
            yield f"{name}:{number}", span


def code_snippets(page: Path) -> Iterator[tuple[str, str]]:
    """(where, text) of every inline code span and every line of a fenced block."""
    name = str(page.relative_to(ROOT))
    yield from inline_spans(page)
    for block in fenced_blocks(page):
        for offset, line in enumerate(block.text.splitlines(), start=1):
            yield f"{name}:{block.line + offset}", line


# ---- job fields ---------------------------------------------------------------------------

JOB_FIELDS = tuple(field.name for field in dataclasses.fields(BackfillJob))


def jobs_page_job_file() -> dict[str, Any]:
    """The job file docs/jobs.md shows (the yaml block headed `# jobs/...`)."""
    for block in fenced_blocks(JOBS_PAGE):
        if block.language == "yaml" and block.text.startswith("# jobs/"):
            data = yaml.safe_load(block.text)
            assert isinstance(data, dict)
            return data
    raise AssertionError("docs/jobs.md shows no job file (a yaml block headed `# jobs/<file>.yaml`)")


def test_the_jobs_page_shows_every_job_field():
    shown = set(jobs_page_job_file())
    one_upstream = set(JOB_FIELDS) - {"sources"}  # `sources` replaces source and primary_key: joins.md shows it
    assert one_upstream <= shown, f"docs/jobs.md's job file lacks {sorted(one_upstream - shown)}"
    assert "`sources`" in JOBS_PAGE.read_text()


BASE_JOB = {"name": "docs", "source": "/tmp/docs-check/orders", "target": "/tmp/docs-check/mv",
            "query": "SELECT order_id, amount FROM source", "primary_key": ["order_id"]}


def test_job_fields_shown_with_a_value_take_that_value():
    shown = [(where, span) for page in PAGES for where, span in inline_spans(page)
             if (match := re.fullmatch(r"([a-z_]+): (\S.*)", span.strip())) and match.group(1) in JOB_FIELDS]
    assert shown, "no `field: value` found: the pattern no longer matches the pages"
    refused = []
    for where, span in shown:
        key, _, value = span.strip().partition(": ")
        try:
            BackfillJob.from_mapping({**BASE_JOB, key: yaml.safe_load(value)}, origin=where)
        except BackfillConfigError as error:
            refused.append(f"{where}: `{span}`: {error}")
    assert not refused, "\n".join(refused)


# ---- command-line flags -------------------------------------------------------------------


class _Parsed(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__(parser.prog)
        self.parser = parser


@contextmanager
def _capturing_parsers() -> Iterator[None]:
    """Stop a command's `main`/`parse_args` at its parse, raising the parser it built."""
    original = argparse.ArgumentParser.parse_args

    def capture(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        raise _Parsed(self)

    argparse.ArgumentParser.parse_args = capture  # type: ignore[method-assign]
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]


def parser_of(entry: Callable[..., Any]) -> argparse.ArgumentParser:
    with _capturing_parsers():
        try:
            entry([])
        except _Parsed as parsed:
            return parsed.parser
    raise AssertionError(f"{entry} parsed no arguments")


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def command_options() -> dict[str, set[str]]:
    """Per command as the pages write it, the options its parser takes."""
    from airflow_backfill import tpch
    from airflow_backfill.cli import build_parser

    commands: dict[str, set[str]] = {}
    cli = build_parser()
    for name, sub in _subcommands(cli).items():
        commands[f"airflow-backfill {name}"] = _options(sub) | _options(cli)
        for action, nested in _subcommands(sub).items():  # `airflow-backfill jars fetch`
            commands[f"airflow-backfill {name} {action}"] = _options(nested) | _options(sub) | _options(cli)
    for script in sorted((ROOT / "spark_jobs").glob("*.py")):
        module = importlib.import_module(f"airflow_backfill.spark_jobs.{script.stem}")
        if hasattr(module, "parse_args"):
            commands[f"spark_jobs/{script.name}"] = _options(parser_of(module.parse_args))
    for script in ("run", "joins", "kafka_backfill", "object_store", "table", "chain", "member_rounds",
                   "folder_backfill", "round_size"):
        module = importlib.import_module(f"bench.{script}")
        commands[f"bench/{script}.py"] = _options(parser_of(getattr(module, "parse_args", None) or module.main))
    for name, sub in _subcommands(parser_of(tpch.parse_args)).items():
        commands[f"airflow_backfill.tpch {name}"] = _options(sub)
    return commands


COMMAND = re.compile(r"(airflow-backfill [a-z-]+(?: [a-z]+)?|spark_jobs/\w+\.py|bench/\w+\.py|airflow_backfill\.tpch [a-z0-9]+)")


def flags_after_commands(text: str) -> Iterator[tuple[str, str]]:
    """(command, flag) for every flag written after a project command on one line (up to a
    comment, a pipe or the end of a code span)."""
    for match in COMMAND.finditer(text):
        rest = re.split(r"\s#|\||;|&&", text[match.end():])[0]
        for flag in FLAG.findall(rest):
            yield match.group(1), flag


def test_every_flag_the_pages_give_a_command_is_one_of_its_options():
    options = command_options()
    unknown, seen = [], 0
    for page in PAGES:
        for where, snippet in code_snippets(page):
            for command, flag in flags_after_commands(snippet):
                seen += 1
                if command not in options and command.rsplit(" ", 1)[0] in options:
                    command = command.rsplit(" ", 1)[0]  # a word after a command without actions
                if command not in options:
                    unknown.append(f"{where}: `{command}` is no command of the project")
                elif flag not in options[command]:
                    unknown.append(f"{where}: `{command}` has no option {flag} (it has {sorted(options[command])})")
    assert seen > 50, f"only {seen} flags found: the pattern no longer matches the pages"
    assert not unknown, "\n".join(unknown)


# ---- dag_run.conf -------------------------------------------------------------------------


def test_the_allowed_conf_keys_of_the_airflow_page_are_the_overrides():
    text = (ROOT / "docs" / "airflow.md").read_text()
    sentence = re.search(r"Allowed keys: (.*?);", text, re.S)
    assert sentence is not None, "docs/airflow.md names no `Allowed keys: ...;`"
    named = re.findall(r"`([a-z_]+)`", sentence.group(1))
    assert sorted(named) == sorted(ALLOWED_KEYS), f"docs/airflow.md allows {named}, the code {list(ALLOWED_KEYS)}"


def conf_examples() -> Iterator[tuple[str, str]]:
    """Every `--conf` a page gives a backfill DAG (one whose file builds a backfill task
    group: other DAGs, such as a reader's, declare params of their own)."""
    for page in PAGES:
        for where, snippet in code_snippets(page):
            for match in re.finditer(r"dags (?:test|trigger) (\S+)[^\n]*?--conf '(\{.*?\})'", snippet):
                if backfill_dag(match.group(1)):
                    yield where, match.group(2)


def backfill_dag(dag_id: str) -> bool:
    """Whether the DAG file under dags/ that declares `dag_id` builds a backfill task group
    (an unknown DAG counts as one, so that a page's typo is still checked)."""
    declared = re.compile(rf"""dag_id=["']{re.escape(dag_id)}["']|^\s*["']{re.escape(dag_id)}["']""", re.M)
    for path in (ROOT / "dags").glob("*.py"):
        for block in path.read_text().split("with DAG(")[1:]:  # one DAG's body each
            if declared.search(block.split(")", 1)[0] + ")"):
                return "backfill_task_group(" in block
    return True


def test_every_conf_the_pages_show_is_accepted():
    examples = list(conf_examples())
    assert examples, "no `--conf '{...}'` found: the pattern no longer matches the pages"
    refused = []
    for where, text in examples:
        try:
            conf = json.loads(text)
        except json.JSONDecodeError as error:
            refused.append(f"{where}: {text} is no JSON object: {error}")
            continue
        try:
            top = {key: value for key, value in conf.items() if not isinstance(value, dict)}
            validate_overrides(top)
            for group, overrides in conf.items():
                if isinstance(overrides, dict):
                    validate_overrides(overrides, origin=f"dag_run.conf[{group!r}]")
        except BackfillConfigError as error:
            refused.append(f"{where}: {error}")
    assert not refused, "\n".join(refused)


# ---- DAG ids ----------------------------------------------------------------------------


def declared_dag_ids() -> set[str]:
    """The DAG ids the DAG files of dags/ and bench/dags/ declare."""
    found = set()
    for path in [*(ROOT / "dags").glob("*.py"), *(ROOT / "bench" / "dags").glob("*.py")]:
        text = path.read_text()
        found |= set(re.findall(r"""dag_id=["']([A-Za-z0-9_.-]+)["']""", text))
        found |= set(re.findall(r"""DAG\(\s*["']([A-Za-z0-9_.-]+)["']""", text))
        found |= set(re.findall(r"""^DAG_ID = ["']([A-Za-z0-9_.-]+)["']""", text, re.M))
    return found


def named_dag_ids() -> list[tuple[str, str]]:
    """(where, DAG id) of every `airflow dags <command> <dag id>` a page shows."""
    named = []
    for page in PAGES:
        for where, snippet in code_snippets(page):
            for match in re.finditer(r"airflow dags (?:test|trigger|unpause|pause|show|state|list-runs) "
                                     r"(?:-\S+ \S+ )*([A-Za-z0-9_.-]+)", snippet):
                named.append((where, match.group(1)))
    return named


def test_every_dag_a_page_names_exists():
    named = named_dag_ids()
    assert any(dag_id == "example_orders_mv" for _, dag_id in named), "the pattern no longer finds the pages' DAGs"
    declared = declared_dag_ids()
    missing = [f"{where}: {dag_id}" for where, dag_id in named if dag_id not in declared]
    assert not missing, f"pages name DAGs no DAG file declares: {missing}"


def test_the_dag_check_finds_a_missing_dag():
    assert "orders_mv" not in declared_dag_ids() and "example_orders_mv" in declared_dag_ids()


# ---- round plans --------------------------------------------------------------------------

ROUND_PLANS_PAGE = ROOT / "docs" / "round-plans.md"


def section(page: Path, heading: str) -> str:
    text = page.read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def test_the_ways_a_round_writes_are_the_planners():
    rows = re.findall(r"^\| `(\w+)` \|", section(ROUND_PLANS_PAGE, "The ways"), re.M)
    assert sorted(rows) == sorted((*WRITES, RECOMPUTE)), f"round-plans.md lists {rows}"


def test_the_round_plan_choices_are_the_jobs():
    listed = re.findall(r"^- `(\w+)`", section(ROUND_PLANS_PAGE, "Choosing by hand"), re.M)
    assert listed == list(ROUND_PLAN_CHOICES), f"round-plans.md offers {listed}, the job {list(ROUND_PLAN_CHOICES)}"
    paragraph = next(p for p in JOBS_PAGE.read_text().split("\n\n") if p.startswith("`round_plan`"))
    assert all(f"`{choice}`" in paragraph for choice in ROUND_PLAN_CHOICES), paragraph


def test_every_round_plan_value_shown_is_a_choice():
    shown = []
    for page in PAGES:
        text = page.read_text()
        shown += [(page.name, value) for value in re.findall(r"round_plan: (\w+)", text)]
        shown += [(page.name, value) for value in re.findall(r'"round_plan": "(\w+)"', text)]
        shown += [(page.name, value) for value in re.findall(r"--round-plan (\w+)", text)]
    assert shown
    wrong = [f"{name}: {value}" for name, value in shown if value not in ROUND_PLAN_CHOICES]
    assert not wrong, f"round plans that are no choice of {ROUND_PLAN_CHOICES}: {wrong}"


# ---- commands' output ---------------------------------------------------------------------

OUTPUT_BLOCKS = [block for page in PAGES for block in console_blocks(page)]


def transcript(text: str) -> list[tuple[str, list[str]]]:
    """(command, the lines shown after it) of a console block."""
    steps: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line.rstrip())
    return steps


@pytest.mark.parametrize("block", OUTPUT_BLOCKS, ids=[block.where for block in OUTPUT_BLOCKS])
def test_a_commands_output_is_what_the_page_shows(block, tmp_path):
    env = {**os.environ, "AIRFLOW_BACKFILL_HOME": str(tmp_path),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    steps = transcript(block.text)
    assert steps, f"{block.where}: a console block without `$ ` commands"
    for command, shown in steps:
        run = subprocess.run(shlex.split(command), cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        printed = iter(line.rstrip() for line in (run.stdout + run.stderr).splitlines())
        missing = [line for line in shown if not any(line == out for out in printed)]
        assert not missing, (f"{block.where}: `{command}` did not print, in this order:\n" + "\n".join(missing)
                             + f"\n--- it printed\n{run.stdout}{run.stderr}")


# ---- figures ------------------------------------------------------------------------------

FIGURE_LINK = re.compile(r"\[([^\]]*\d[^\]]*)\]\(((?:docs/)?benchmarks\.md)#([\w.-]+)\)")
FIGURE = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:x\b| s\b| ms\b| MiB\b| GiB\b)")
"""A figure in a link's text: a ratio, seconds or memory (`SF 10`, `1 %` are labels)."""
RATIO = re.compile(r"(?<![\w.])\d+(?:\.\d+)?x\b")
GENERATED = re.compile(r"<!-- bench-table: (\w+) start -->.*?<!-- bench-table: \1 end -->", re.S)


def _blank(match: re.Match[str]) -> str:
    """What a removed part leaves: its line breaks, so that line numbers hold."""
    return "\n" * match.group(0).count("\n")


def test_the_generated_tables_are_those_of_the_committed_runs():
    runs = table.load_runs()
    assert runs, "bench/results/ holds no run"
    stale = [str(page.relative_to(ROOT)) for page, (text, new) in table.pages_with(runs).items() if text != new]
    assert not stale, f"{stale} differ from bench/results/: run `python bench/table.py` and commit both"


def quoting_pages() -> list[Path]:
    return [page for page in PAGES if page.name not in BENCHMARK_PAGES]


def test_every_figure_quoted_from_the_table_is_the_rows():
    runs = table.load_runs()
    wrong, quoted = [], 0
    for page in quoting_pages():
        prose = GENERATED.sub(_blank, text_without_blocks(page))
        for text, _, anchor in FIGURE_LINK.findall(prose):
            figures = FIGURE.findall(text)
            if not figures:
                continue  # a label such as [SF 10](...): the row, no figure
            quoted += 1
            row = table.ROWS_BY_ANCHOR.get(anchor)
            found = table.latest(row, runs) if row else None
            if found is None:
                wrong.append(f"{page.name}: [{text}] links to #{anchor}, no row of the table with a figure")
                continue
            figure = found[1].text
            stray = [quote for quote in figures if quote not in FIGURE.findall(figure)]
            if stray:
                wrong.append(f"{page.name}: [{text}](...#{anchor}) quotes {stray}; the row says {figure!r}")
    assert quoted >= 5, f"only {quoted} figures linked to the table: the pattern no longer matches the pages"
    assert not wrong, "figures that disagree with the table:\n" + "\n".join(wrong)


def test_no_ratio_is_quoted_outside_a_link_to_its_row():
    unlinked = []
    for page in quoting_pages():
        prose = GENERATED.sub(_blank, text_without_blocks(page))
        for number, line in enumerate(FIGURE_LINK.sub(_blank, prose).splitlines(), start=1):
            unlinked += [f"{page.name}:{number}: {ratio} in {line.strip()!r}" for ratio in RATIO.findall(line)]
    assert not unlinked, ("ratios quoted outside a link to their row of docs/benchmarks.md (write "
                          "`[2.31x](benchmarks.md#round-stateless)`, or link to the row without the figure):\n"
                          + "\n".join(unlinked))


# ---- the glossary -------------------------------------------------------------------------

GLOSSARY_TERMS = {
    "rf1-rf2": r"\bRF[12]\b",
    "q1-q3": r"\bQ[13]\b",
    "floor": r"\bfloor\b",
    "app-transaction": r"\bapp transactions?\b",
    "listed-files": r"\bchecksum(?:'s)?\s+(?:lists|files?\b)",
    "held-rows": r"held by the driver|\bthe driver holds\b|\bheld whole\b",
    "walk": r"\bwalk(?:s|ed|ing)?\b",
    "vector-watermark": r"(?<!deletion )\bvector\b",
}
"""Terms used before they were defined, by their glossary anchor: where a page first uses
one (outside code), it links to the glossary."""
GLOSSARY_LINK = re.compile(r"\[([^\]]+)\]\((?:docs/)?glossary\.md#([\w-]+)\)")


def test_each_page_links_a_glossary_term_where_it_first_uses_it():
    from test_docs import anchors

    defined = anchors(ROOT / "docs" / "glossary.md")
    assert set(GLOSSARY_TERMS) <= defined, f"glossary.md defines no {sorted(set(GLOSSARY_TERMS) - defined)}"
    unlinked = []
    for page in PAGES:
        if page.name == "glossary.md" or page.name in BENCHMARK_PAGES:
            continue
        prose = INLINE_CODE.sub(lambda match: " " * len(match.group(0)), text_without_blocks(page))
        linked = [(match.start(), match.end(), match.group(2)) for match in GLOSSARY_LINK.finditer(prose)]
        for anchor, pattern in GLOSSARY_TERMS.items():
            first = re.search(pattern, prose)
            if first is None:
                continue
            if not any(start <= first.start() < end and target == anchor for start, end, target in linked):
                line = prose.count("\n", 0, first.start()) + 1
                unlinked.append(f"{page.relative_to(ROOT)}:{line}: {first.group(0)!r} (glossary.md#{anchor})")
    assert not unlinked, "first uses of a glossary term without a link to it:\n" + "\n".join(unlinked)


# ---- size thresholds ---------------------------------------------------------------------


def test_the_sizes_page_lists_every_threshold_with_its_value():
    """docs/sizes.md has one row per field of `engine/sizes.Sizes`, with its default."""
    from airflow_backfill.engine.sizes import Sizes

    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+) \|", (ROOT / "docs" / "sizes.md").read_text(), re.M))

    def shown(value: float) -> str:
        if isinstance(value, float):
            return f"{value:g}"
        for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20)):
            if value >= size and value % size == 0:
                return f"{value // size} {unit}"
        return f"{value:,}"

    expected = {field.name: shown(field.default) for field in dataclasses.fields(Sizes)}
    assert {name: value.strip() for name, value in rows.items()} == expected
