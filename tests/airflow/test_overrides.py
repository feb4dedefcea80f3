"""dag_run.conf overrides are checked by key, type and range before any Spark work."""

from __future__ import annotations

import pytest

from airflow_backfill.exceptions import BackfillConfigError
from airflow_backfill.overrides import job_overrides, validate_overrides


def test_valid_overrides_are_returned_and_split():
    conf = {"backfill_parallelism": 4, "parallelism": 1, "rate_limit": None, "lag_threshold": 0,
            "round_plan": "recompute", "forward_max_epochs": 5, "forward_idle_timeout": 2}
    checked = validate_overrides(conf)
    assert checked["forward_idle_timeout"] == 2.0
    assert job_overrides(checked) == {"backfill_parallelism": 4, "parallelism": 1, "rate_limit": None,
                                      "lag_threshold": 0, "round_plan": "recompute"}


def test_empty_conf_means_no_overrides():
    assert validate_overrides(None) == {}
    assert validate_overrides({}) == {}


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"backfill_paralelism": 4}, r"unknown key\(s\) in dag_run.conf: backfill_paralelism\. Allowed keys: "
                                     r"backfill_parallelism"),
        ({"backfill_parallelism": "4"}, r"dag_run.conf\['backfill_parallelism'\] must be an integer between 1"),
        ({"backfill_parallelism": 0}, r"dag_run.conf\['backfill_parallelism'\] must be between 1 and"),
        ({"parallelism": True}, r"dag_run.conf\['parallelism'\] must be an integer"),
        ({"rate_limit": -5}, r"rate_limit must be between 1 and"),
        ({"lag_threshold": 1.5}, r"lag_threshold must be a non-negative integer"),
        ({"round_plan": "sometimes"}, r"round_plan must be one of auto, incremental, recompute, merge, got 'sometimes'"),
        ({"forward_max_epochs": 0}, r"dag_run.conf\['forward_max_epochs'\] must be a positive integer or null"),
        ({"forward_idle_timeout": "soon"}, r"dag_run.conf\['forward_idle_timeout'\] must be a positive number"),
    ],
)
def test_invalid_overrides_name_the_key_and_the_fix(conf, message):
    with pytest.raises(BackfillConfigError, match=message):
        validate_overrides(conf)


def test_group_overrides_scope_to_the_group_and_leave_the_dags_own_keys_alone():
    from airflow_backfill.overrides import group_overrides

    conf = {
        "rate_limit": 1000,                                  # every group
        "summary": {"backfill_parallelism": 4},              # this group only
        "totals": {"backfill_parallelism": 1, "rate_limit": None},
        "report_date": "2026-01-01", "forward_max_epochs": 2,  # DAG params and a shared bound
    }
    assert group_overrides(conf, "summary") == {"rate_limit": 1000, "backfill_parallelism": 4,
                                                "forward_max_epochs": 2}
    assert group_overrides(conf, "totals") == {"rate_limit": None, "backfill_parallelism": 1,
                                               "forward_max_epochs": 2}
    assert group_overrides({"report_date": "2026-01-01"}, "summary") == {}


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"summary": {"backfill_paralelism": 4}}, r"unknown key\(s\) in dag_run.conf\['summary'\]: backfill_paralelism"),
        ({"summary": {"parallelism": 0}}, r"dag_run.conf\['summary'\]\['parallelism'\] must be between 1 and"),
        ({"summary": 4}, r"dag_run.conf\['summary'\] holds the overrides of backfill group 'summary' and must be a JSON object"),
        ({"backfill_parallelism": "many"}, r"dag_run.conf\['backfill_parallelism'\] must be an integer"),
    ],
)
def test_group_overrides_are_checked_inside_the_group(conf, message):
    from airflow_backfill.overrides import group_overrides

    with pytest.raises(BackfillConfigError, match=message):
        group_overrides(conf, "summary")
