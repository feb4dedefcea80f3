from __future__ import annotations

import pytest

from airflow_backfill.exceptions import BackfillConfigError
from airflow_backfill.job import BackfillJob, load_job

VALID = {
    "name": "orders_mv",
    "source": "/data/orders",
    "target": "/data/orders_mv",
    "query": "SELECT order_id FROM source",
    "primary_key": ["order_id"],
}


def test_job_file_round_trip(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(
        "name: orders_mv\nsource: file:///data/orders\ntarget: /data/orders_mv\n"
        "query: SELECT order_id FROM source\nprimary_key: order_id\nbackfill_parallelism: 4\n"
        "parallelism: 1\nlag_threshold: 2\nrate_limit: 1000\n"
    )
    job = load_job(path)
    assert job.source == "/data/orders"
    assert job.primary_key == ("order_id",)
    assert (job.backfill_parallelism, job.parallelism, job.lag_threshold, job.rate_limit) == (4, 1, 2, 1000)
    assert job.app_id == "airflow_backfill/orders_mv"
    assert BackfillJob.from_mapping(job.to_mapping()) == job


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"name": "1bad name"}, "name must start with a letter"),
        ({"backfill_parallelism": 0}, "backfill_parallelism must be between 1 and"),
        ({"parallelism": "2"}, "parallelism must be an integer"),
        ({"parallelism": True}, "parallelism must be an integer"),
        ({"lag_threshold": -1}, "lag_threshold must be a non-negative integer"),
        ({"rate_limit": 0}, "rate_limit must be between 1 and"),
        ({"primary_key": []}, "primary_key must be a column name"),
        ({"primary_key": ["a", "a"]}, "lists a column twice"),
        ({"target": "/data/orders"}, "source and target are the same table"),
        ({"source": "gs://bucket/orders"}, "on local paths (a path or file://) and on S3-compatible stores"),
        ({"source": "s3://bucket"}, "is not a table URI on S3"),
        ({"source": "s3://Bad_Bucket/orders"}, "is not a table URI on S3"),
        ({"aws_conn_id": ""}, "aws_conn_id must be an Airflow connection id"),
        ({"query": " "}, "query must be a non-empty"),
        ({"poll_interval": 0}, "poll_interval must be in"),
        ({"verify_primary_key": "no"}, "verify_primary_key must be true or false"),
        ({"round_plan": "fast"}, "round_plan must be one of auto, incremental, recompute"),
        ({"colour": "blue"}, "unknown field(s) colour"),
    ],
)
def test_invalid_fields_name_the_problem(change, message):
    with pytest.raises(BackfillConfigError) as caught:
        BackfillJob.from_mapping({**VALID, **change})
    assert message in str(caught.value)


def test_missing_fields_are_listed():
    with pytest.raises(BackfillConfigError, match="missing required field\\(s\\) query, primary_key"):
        BackfillJob.from_mapping({k: v for k, v in VALID.items() if k not in ("query", "primary_key")})


def test_job_file_errors_name_the_file(tmp_path):
    with pytest.raises(BackfillConfigError, match="does not exist"):
        load_job(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(BackfillConfigError, match=f"job file {bad} is not valid YAML"):
        load_job(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("just a string\n")
    with pytest.raises(BackfillConfigError, match="expected a mapping"):
        load_job(scalar)


def test_paths_expand_the_backfill_home_and_refuse_unset_variables(monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW_BACKFILL_HOME", str(tmp_path))
    job = BackfillJob.from_mapping({**VALID, "source": "${AIRFLOW_BACKFILL_HOME}/orders"})
    assert job.source == str(tmp_path / "orders")
    monkeypatch.delenv("AIRFLOW_BACKFILL_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    job = BackfillJob.from_mapping({**VALID, "source": "${AIRFLOW_BACKFILL_HOME}/orders"})
    assert job.source == str(tmp_path / "home" / "airflow_backfill" / "orders")
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    with pytest.raises(BackfillConfigError, match="environment variable that is not set"):
        BackfillJob.from_mapping({**VALID, "source": "${NOT_SET_ANYWHERE}/orders"})


def test_s3_tables_are_kept_as_uris_and_name_their_connection():
    job = BackfillJob.from_mapping({**VALID, "source": "s3://lake/orders/", "target": "s3a://lake/mv/orders",
                                    "aws_conn_id": "lake"})
    assert (job.source, job.target, job.aws_conn_id) == ("s3://lake/orders", "s3a://lake/mv/orders", "lake")
    assert BackfillJob.from_mapping(job.to_mapping()) == job
