"""The provider's settings: one `[airflow_backfill]` section in Airflow's configuration, with
the `AIRFLOW_BACKFILL_*` variables as overrides, readable without Airflow or Spark."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_backfill.config import (
    OPTIONS,
    SECTION,
    cache_dir,
    provider_config,
    setting,
    settings_environment,
)
from airflow_backfill.exceptions import BackfillConfigError
from airflow_backfill.get_provider_info import get_provider_info
from airflow_backfill.storage.lease import lease_duration

ROOT = Path(__file__).resolve().parents[1]
NOT_SETTINGS = {"AIRFLOW_BACKFILL_FAULT", "AIRFLOW_BACKFILL_KAFKA_SETTINGS"}
"""Variables that are no setting: fault injection for the crash tests, and the channel that
carries a Kafka connection from an operator to its spark-submit."""


def airflow_cfg(tmp_path: Path, text: str) -> dict[str, str]:
    (tmp_path / "airflow.cfg").write_text(text)
    return {"AIRFLOW_HOME": str(tmp_path)}


def test_the_precedence_is_own_variable_then_airflows_configuration_then_default(tmp_path):
    environ = airflow_cfg(tmp_path, f"[{SECTION}]\nlease_seconds = 20\n")
    assert setting("lease_seconds", environ) == "20"
    environ["AIRFLOW__AIRFLOW_BACKFILL__LEASE_SECONDS"] = "15"
    assert setting("lease_seconds", environ) == "15"
    environ["AIRFLOW_BACKFILL_LEASE_SECONDS"] = "9"
    assert setting("lease_seconds", environ) == "9"
    assert setting("lease_seconds", {"AIRFLOW_HOME": str(tmp_path / "none")}) == "60"


def test_airflow_config_names_its_file(tmp_path):
    (tmp_path / "other.cfg").write_text(f"[{SECTION}]\ncache_dir = {tmp_path / 'cache'}\n")
    assert cache_dir({"AIRFLOW_CONFIG": str(tmp_path / "other.cfg")}) == str(tmp_path / "cache")
    assert cache_dir({"HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "xdg"),
                      "AIRFLOW_HOME": str(tmp_path / "none")}) == str(tmp_path / "xdg" / "airflow-backfill")


def test_every_option_is_declared_for_airflow_with_what_its_reference_shows():
    section = get_provider_info()["config"][SECTION]
    assert section == provider_config()[SECTION]
    assert list(section["options"]) == [option.name for option in OPTIONS]
    for name, declared in section["options"].items():
        assert set(declared) == {"description", "version_added", "type", "example", "default"}, name
        assert declared["description"] and declared["type"] in ("string", "integer", "float"), name


def test_every_variable_the_package_reads_is_an_option_or_named_as_no_setting():
    read = set()
    for path in [*(ROOT / "airflow_backfill").rglob("*.py"), *(ROOT / "spark_jobs").glob("*.py")]:
        read |= set(re.findall(r"AIRFLOW_BACKFILL_[A-Z0-9_]*[A-Z0-9]", path.read_text()))
    options = {option.environment_variable for option in OPTIONS}
    assert read - options - NOT_SETTINGS == set()
    assert {"AIRFLOW_BACKFILL_SIZES", "AIRFLOW_BACKFILL_HOME"} <= read  # the search finds what it looks for


def test_a_task_hands_what_differs_from_the_defaults_to_its_driver(monkeypatch, tmp_path):
    for option in OPTIONS:
        monkeypatch.delenv(option.environment_variable, raising=False)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    monkeypatch.setenv("AIRFLOW__AIRFLOW_BACKFILL__JARS_DIR", "provided")
    monkeypatch.setenv("AIRFLOW_BACKFILL_LEASE_SECONDS", "60")  # the default: nothing to hand over
    assert settings_environment() == {"AIRFLOW_BACKFILL_JARS_DIR": "provided"}
    from airflow.configuration import conf  # loaded: Airflow's own conf is asked, and it expands `~`

    assert "airflow.configuration" in sys.modules and conf.get("airflow_backfill", "jars_dir") == "provided"
    assert settings_environment() == {"AIRFLOW_BACKFILL_JARS_DIR": "provided"}


def test_a_bad_lease_is_refused_naming_the_setting(monkeypatch):
    monkeypatch.setenv("AIRFLOW_BACKFILL_LEASE_SECONDS", "soon")
    with pytest.raises(BackfillConfigError, match=r"\[airflow_backfill\] lease_seconds"):
        lease_duration()
    monkeypatch.setenv("AIRFLOW_BACKFILL_LEASE_SECONDS", "2.5")
    assert lease_duration() == 2.5


def test_reading_the_settings_imports_neither_airflow_nor_spark(tmp_path):
    probe = ("import sys; from airflow_backfill.config import OPTIONS, setting; "
             "[setting(option.name) for option in OPTIONS]; "
             "from airflow_backfill.engine.delta.jars import s3a_classpath_conf; s3a_classpath_conf(); "
             "print(sorted(m for m in ('airflow', 'pyspark') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          check=True)
    assert done.stdout.strip() == "[]"


def test_airflow_config_get_value_reads_the_section(tmp_path):
    env = {**_without_own_variables(), "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}

    def get_value(option: str, **extra: str) -> str:
        done = subprocess.run([sys.executable, "-m", "airflow", "config", "get-value", SECTION, option],
                              env={**env, **extra}, capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert get_value("lease_seconds") == "60"
    assert get_value("lease_seconds", AIRFLOW__AIRFLOW_BACKFILL__LEASE_SECONDS="12") == "12"


def _without_own_variables() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if not key.startswith("AIRFLOW_BACKFILL_")}
