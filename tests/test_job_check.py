"""`airflow-backfill check`: a job folder's CI refuses what the DAG processor would, with one
line per job file and a non-zero exit, without Spark or Airflow."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from airflow_backfill.cli import main

GOOD = "name: good\nsource: lake/orders\ntarget: lake/good\nquery: SELECT id, kind FROM source\nprimary_key: [id]\n"
DISTINCT = GOOD.replace("name: good", "name: distinct").replace("lake/good", "lake/distinct").replace(
    "SELECT id, kind FROM source", "SELECT DISTINCT id, kind FROM source LIMIT 5")
RIGHT_JOIN = """name: right
target: lake/right
sources:
  o: {table: lake/orders, primary_key: [id]}
  c: {table: lake/customers, primary_key: [c_id]}
query: SELECT o.id, c.c_id FROM o RIGHT JOIN c ON o.customer = c.c_id
"""
KAFKA_COUNT_DISTINCT = """upstream: {bootstrap_servers: "127.0.0.1:9092", topic: orders, value_schema: "id BIGINT, kind STRING"}
source_job: {name: orders_source, table: lake/orders_topic}
backfill: {name: kinds, target: lake/kinds, query: "SELECT id, COUNT(DISTINCT kind) AS n FROM source GROUP BY id"}
"""


def folder(tmp_path: Path, files: dict[str, str]) -> Path:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    for name, text in files.items():
        (jobs / name).write_text(text)
    return jobs


def test_a_folder_with_bad_jobs_exits_1_with_one_line_per_job_naming_the_construct(tmp_path, capsys):
    jobs = folder(tmp_path, {"good.yaml": GOOD, "distinct.yaml": DISTINCT, "right.yaml": RIGHT_JOIN,
                             "kinds.yaml": KAFKA_COUNT_DISTINCT})
    assert main(["check", "--jobs-in", str(jobs)]) == 1
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert len(lines) == 4
    by_file = {Path(line.split(": ", 1)[0]).name: line.split(": ", 1)[1] for line in lines}
    assert by_file["good.yaml"] == "ok"
    assert by_file["distinct.yaml"].startswith("DISTINCT (use GROUP BY over the selected columns) is not supported")
    assert "RIGHT JOIN c is not supported" in by_file["right.yaml"]
    assert "COUNT(DISTINCT ...) is not supported over a Kafka topic" in by_file["kinds.yaml"]
    assert "3 of 4 job files refused" in err


def test_good_job_files_exit_0(tmp_path, capsys):
    jobs = folder(tmp_path, {"good.yaml": GOOD})
    assert main(["check", "--job", str(jobs / "good.yaml")]) == 0
    assert capsys.readouterr().out == f"{jobs / 'good.yaml'}: ok\n"


def test_a_missing_file_and_a_missing_folder_are_named(tmp_path, capsys):
    assert main(["check", "--job", str(tmp_path / "nope.yaml")]) == 1
    assert "nope.yaml does not exist" in capsys.readouterr().out
    assert main(["check", "--jobs-in", str(tmp_path / "nowhere")]) == 2
    assert "job folder" in capsys.readouterr().err
    assert main(["check"]) == 2
    assert "--job FILE" in capsys.readouterr().err


def test_with_tables_reads_the_upstreams_as_pin_epoch_does(tmp_path, capsys):
    jobs = folder(tmp_path, {"good.yaml": GOOD})
    assert main(["check", "--job", str(jobs / "good.yaml")]) == 0  # the table is not read by default
    capsys.readouterr()
    assert main(["check", "--with-tables", "--job", str(jobs / "good.yaml")]) == 1
    assert "is not a Delta table" in capsys.readouterr().out
    rows = pa.table({"id": pa.array([1, 2], pa.int64()), "kind": ["a", "b"]})
    write_deltalake(str(jobs / "lake" / "orders"), rows)
    assert main(["check", "--with-tables", "--job", str(jobs / "good.yaml")]) == 1
    assert "does not have the Change Data Feed enabled" in capsys.readouterr().out
    write_deltalake(str(jobs / "lake" / "cdf_orders"), rows, configuration={"delta.enableChangeDataFeed": "true"})
    (jobs / "good.yaml").write_text(GOOD.replace("lake/orders", "lake/cdf_orders"))
    assert main(["check", "--with-tables", "--job", str(jobs / "good.yaml")]) == 0
    (jobs / "good.yaml").write_text(GOOD.replace("lake/orders", "lake/cdf_orders").replace("[id]", "[order_id]")
                                    .replace("SELECT id", "SELECT order_id"))
    assert main(["check", "--with-tables", "--job", str(jobs / "good.yaml")]) == 1
    assert "order_id" in capsys.readouterr().out


def test_check_starts_neither_spark_nor_airflow(tmp_path):
    jobs = folder(tmp_path, {"good.yaml": GOOD, "distinct.yaml": DISTINCT})
    probe = ("import sys; from airflow_backfill.cli import main; code = main(['check', '--jobs-in', sys.argv[1]]); "
             "print(sorted(m for m in ('airflow', 'pyspark') if m in sys.modules)); sys.exit(code)")
    done = subprocess.run([sys.executable, "-c", probe, str(jobs)], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"


@pytest.mark.parametrize(("query", "named"), [
    ("SELECT id, kind FROM source ORDER BY id", "ORDER BY (an MV is an unordered table) is not supported"),
    ("SELECT id, rank() OVER (ORDER BY kind) AS r FROM source", "window functions (OVER ...) are not supported"),
    ("SELECT id, rand() AS r FROM source", "non-deterministic function RAND() is not supported"),
    ("SELECT kind FROM source", "the MV's primary key must be derivable from the upstream's"),
])
def test_every_refused_construct_is_named_by_check(tmp_path, capsys, query, named):
    jobs = folder(tmp_path, {"bad.yaml": GOOD.replace("SELECT id, kind FROM source", query)})
    assert main(["check", "--job", str(jobs / "bad.yaml")]) == 1
    assert capsys.readouterr().out.startswith(f"{jobs / 'bad.yaml'}: {named}")
