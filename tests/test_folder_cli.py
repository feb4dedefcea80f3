"""`airflow-backfill backfill --jobs-in` and `status --jobs-in`: what a person types is
checked where it enters, with an error naming the problem and the fix, before any Spark
application starts; the folder's status reads each MV from its log and state alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from airflow_backfill.cli import main


def write_job(folder: Path, name: str, **fields) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    job = {"name": name, "source": "../lake/orders", "target": f"../lake/{name}",
           "query": "SELECT order_id, amount FROM source", "primary_key": ["order_id"], **fields}
    (folder / f"{name}.yaml").write_text(yaml.safe_dump(job))


@pytest.mark.parametrize("flags, said", [
    (["--backfill-workers", "0"], "expected a whole number from 1 to 64, got 0"),
    (["--timeout", "soon"], "expected a number of seconds, got 'soon'"),
    (["--progress-interval", "-1"], "expected more than 0 and at most 604800 seconds"),
])
def test_backfill_refuses_bad_flags_before_spark(tmp_path, capsys, flags, said):
    write_job(tmp_path / "jobs", "orders_mv")
    assert main(["backfill", "--jobs-in", str(tmp_path / "jobs"), *flags]) != 0
    assert said in capsys.readouterr().err


def test_backfill_of_a_folder_without_a_job_names_the_fix(tmp_path, capsys):
    (tmp_path / "jobs").mkdir()
    assert main(["backfill", "--jobs-in", str(tmp_path / "jobs")]) != 0
    error = capsys.readouterr().err
    assert "has no Delta job to backfill" in error and "add job files" in error


def test_status_of_a_folder_lists_every_job_and_the_files_that_failed(tmp_path, capsys):
    write_job(tmp_path / "jobs", "orders_mv")
    write_job(tmp_path / "jobs", "broken", query="SELECT order_id, amount FROM source GROUP BY")
    assert main(["status", "--jobs-in", str(tmp_path / "jobs"), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [(row["job"], row["phase"], row["watermark"]) for row in shown["mvs"]] == [("orders_mv", "not started",
                                                                                       None)]
    assert list(shown["load_errors"]) == [str(tmp_path / "jobs" / "broken.yaml")]
