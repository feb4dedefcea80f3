"""When a phase's driver starts on the JVM class archive, and what it is given: the
archive's empty conf folder, the usual settings file, the archive in its Java options;
and every case that keeps it off the archive (switched off, missing, stale, a conf folder
the driver must keep on its classpath)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from airflow_backfill import cli
from airflow_backfill.engine.launch import class_archive as jvm_archive
from airflow_backfill.engine.launch.class_archive import (
    ArchiveLaunch,
    archive_launch,
    build_archive,
    fingerprint,
)
from airflow_backfill.exceptions import BackfillConfigError


@pytest.fixture
def user_conf(tmp_path: Path) -> Path:
    folder = tmp_path / "spark-conf"
    folder.mkdir()
    (folder / "spark-defaults.conf").write_text("spark.ui.enabled false\n")
    return folder


def built_archive(tmp_path: Path, user_conf: Path, *, for_fingerprint: str | None = None) -> dict[str, str]:
    """An environment whose archive file, manifest and empty conf folder are in place."""
    environ = {"AIRFLOW_BACKFILL_JVM_ARCHIVE": str(tmp_path / "jvm" / "driver.jsa"), "SPARK_CONF_DIR": str(user_conf)}
    (tmp_path / "jvm" / "conf").mkdir(parents=True)
    (tmp_path / "jvm" / "driver.jsa").write_bytes(b"archive")
    manifest = {"fingerprint": for_fingerprint or fingerprint(environ)}
    (tmp_path / "jvm" / "driver.jsa.json").write_text(json.dumps(manifest))
    return environ


def test_a_current_archive_gives_the_conf_folder_the_settings_file_and_the_java_option(tmp_path, user_conf):
    environ = built_archive(tmp_path, user_conf)
    launch = archive_launch(environ)
    assert launch == ArchiveLaunch(str(tmp_path / "jvm" / "driver.jsa"), str(tmp_path / "jvm" / "conf"),
                                   str(user_conf / "spark-defaults.conf"))
    assert launch.environment() == {"SPARK_CONF_DIR": str(tmp_path / "jvm" / "conf")}
    option = f"-XX:SharedArchiveFile={tmp_path / 'jvm' / 'driver.jsa'}"
    assert launch.driver_java_options("-Xss4m") == f"-Xss4m {option}"
    assert launch.submit_arguments() == ["--properties-file", str(user_conf / "spark-defaults.conf"),
                                         "--conf", f"spark.driver.extraJavaOptions={option}"]


def test_a_properties_file_the_user_gave_is_kept(tmp_path, user_conf):
    launch = archive_launch(built_archive(tmp_path, user_conf), properties_file="/etc/spark/mine.conf")
    assert launch is not None and launch.properties_file == "/etc/spark/mine.conf"


def test_switched_off_or_missing_means_no_archive(tmp_path, user_conf):
    environ = built_archive(tmp_path, user_conf)
    assert archive_launch({**environ, "AIRFLOW_BACKFILL_JVM_ARCHIVE": "off"}) is None
    assert archive_launch({**environ, "AIRFLOW_BACKFILL_JVM_ARCHIVE": str(tmp_path / "none.jsa")}) is None


def test_an_archive_built_for_other_jars_is_not_used(tmp_path, user_conf, caplog):
    environ = built_archive(tmp_path, user_conf, for_fingerprint="other jars")
    with caplog.at_level(logging.WARNING, logger=jvm_archive.__name__):
        assert archive_launch(environ) is None
    assert "rebuild it with `airflow-backfill jvm-archive`" in caplog.text
    assert not jvm_archive.archive_is_current(environ)


def test_a_conf_folder_the_driver_reads_from_its_classpath_keeps_the_archive_off(tmp_path, user_conf, caplog):
    environ = built_archive(tmp_path, user_conf)
    (user_conf / "log4j2.properties").write_text("rootLogger.level = warn\n")
    with caplog.at_level(logging.INFO, logger=jvm_archive.__name__):
        assert archive_launch(environ) is None
    assert "log4j2.properties" in caplog.text
    with pytest.raises(BackfillConfigError, match="log4j2.properties.*Keep only spark-defaults.conf"):
        build_archive(environ)


def test_something_in_the_archive_conf_folder_keeps_the_archive_off(tmp_path, user_conf):
    environ = built_archive(tmp_path, user_conf)
    (tmp_path / "jvm" / "conf" / "stray.xml").write_text("<x/>")
    assert archive_launch(environ) is None
    with pytest.raises(BackfillConfigError, match="must stay empty"):
        build_archive(environ)


def test_the_command_reports_a_current_archive_without_building(tmp_path, user_conf, monkeypatch, capsys):
    for key, value in built_archive(tmp_path, user_conf).items():
        monkeypatch.setenv(key, value)
    assert cli.main(["jvm-archive", "--if-stale"]) == 0
    assert "is up to date" in capsys.readouterr().out


def test_a_session_this_process_launches_starts_on_the_archive_and_restores_the_environment(spark):
    """The tests' shared session went through `build_spark_session`, as the CLI's do."""
    launch = archive_launch()
    assert launch is not None, "no current JVM archive: run `airflow-backfill jvm-archive` (scripts/test.sh does)"
    assert f"-XX:SharedArchiveFile={launch.archive}" in spark.conf.get("spark.driver.extraJavaOptions")
    assert os.environ.get("SPARK_CONF_DIR") != launch.conf_dir
    assert "--properties-file" not in os.environ.get("PYSPARK_SUBMIT_ARGS", "")
