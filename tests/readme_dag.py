"""The README's job file and DAG laid out as a deployment holds them: the DAG file in a
DAG folder, its job file in `jobs/` beside it (tests/airflow/test_dag_relative_paths.py,
tests/e2e/test_readme_dag.py)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_block(language: str) -> str:
    """The README's first fenced block of `language` (its job file, its DAG)."""
    match = re.search(rf"```{language}\n(.*?)\n```", (ROOT / "README.md").read_text(), re.S)
    assert match is not None, f"README.md has no {language} block"
    return match.group(1)


def readme_deployment(folder: Path) -> Path:
    """`folder/dags` with the README's DAG as `orders_mv.py` and its job as `jobs/orders_mv.yaml`."""
    dags = folder / "dags"
    (dags / "jobs").mkdir(parents=True)
    (dags / "orders_mv.py").write_text(readme_block("python"))
    (dags / "jobs" / "orders_mv.yaml").write_text(readme_block("yaml"))
    return dags
