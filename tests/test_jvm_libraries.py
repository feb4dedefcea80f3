"""The pinned jars: resolved once by `airflow-backfill jars fetch` into the provider's cache,
found there at run time, and a missing set named with the command that fetches it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from airflow_backfill.cli import main
from airflow_backfill.engine.delta.jars import delta_jars, delta_spark_conf, s3a_classpath_conf
from airflow_backfill.exceptions import BackfillConfigError
from airflow_backfill.jvm import fetch as fetch_module
from airflow_backfill.jvm.libraries import KAFKA_BROKER, S3A, SPARK, STAMP, local_fs_jar, pyspark_jars_dir

FAKE_MVN = """#!{python}
import os, sys
out = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("-DoutputDirectory="))
if os.environ.get("FAKE_MVN_FAIL"):
    print("[ERROR] Could not resolve dependencies"); sys.exit(1)
os.makedirs(out, exist_ok=True)
for name in os.environ["FAKE_MVN_JARS"].split(","):
    open(os.path.join(out, name), "w").close()
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    for option in ("JARS_DIR", "S3A_JARS_DIR", "KAFKA_BROKER_JARS", "CACHE_DIR"):
        monkeypatch.delenv(f"AIRFLOW_BACKFILL_{option}", raising=False)
    monkeypatch.setenv("AIRFLOW_BACKFILL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def fake_mvn(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mvn").write_text(FAKE_MVN.format(python=sys.executable))
    (bin_dir / "mvn").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    shipped = sorted(os.listdir(pyspark_jars_dir()))
    hadoop_client = next(name for name in shipped if name.startswith("hadoop-client-api-"))
    monkeypatch.setenv("FAKE_MVN_JARS", f"delta-spark_4.2_2.13-4.4.0.jar,delta-storage-4.4.0.jar,"
                                        f"{hadoop_client.replace('hadoop-client-api-', 'hadoop-client-api-9.9.')}")


def test_missing_jars_are_an_error_naming_the_command_and_the_folder(cache):
    with pytest.raises(BackfillConfigError) as missing:
        delta_jars()
    assert "run `airflow-backfill jars fetch` once" in str(missing.value)
    assert str(cache / "jars") in str(missing.value)
    assert "[airflow_backfill] jars_dir" in str(missing.value)
    assert s3a_classpath_conf() == {}  # S3A is optional: no tables on S3, no jars needed


def test_fetch_resolves_once_leaves_out_what_pyspark_ships_and_the_phases_find_it(cache, fake_mvn, capsys):
    assert main(["jars", "fetch", "--check"]) == 1
    assert main(["jars", "fetch", "--no-s3a"]) == 0
    folder = Path(SPARK.folder())
    assert folder.parent == cache / "jars" / __import__("airflow_backfill").__version__
    assert sorted(path.name for path in folder.glob("*.jar")) == ["delta-spark_4.2_2.13-4.4.0.jar",
                                                                  "delta-storage-4.4.0.jar"]
    assert "1 left out: pyspark ships them" in capsys.readouterr().out
    assert SPARK.is_current(str(folder)) and (folder / STAMP).is_file()
    assert main(["jars", "fetch", "--no-s3a", "--check"]) == 0
    assert main(["jars", "fetch", "--no-s3a"]) == 0
    assert "is up to date" in capsys.readouterr().out
    jars = delta_jars()
    assert jars[:2] == [str(folder / "delta-spark_4.2_2.13-4.4.0.jar"), str(folder / "delta-storage-4.4.0.jar")]
    own = local_fs_jar()
    assert jars[2:] == ([own] if own else [])
    assert delta_spark_conf()["spark.jars"] == ",".join(jars)


def test_a_failed_fetch_leaves_no_folder(cache, fake_mvn, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_MVN_FAIL", "1")
    assert main(["jars", "fetch", "--no-s3a"]) == 2
    assert "Could not resolve dependencies" in capsys.readouterr().err
    assert not (cache / "jars").exists() or not any((cache / "jars").rglob("*.jar"))


def test_without_maven_the_error_says_to_install_it(cache, monkeypatch, tmp_path):
    monkeypatch.setattr(fetch_module.shutil, "which", lambda name: None)
    with pytest.raises(BackfillConfigError, match=r"Maven \(mvn\) is not on PATH"):
        fetch_module.fetch(SPARK)


def test_a_configured_folder_or_provided_wins_over_the_cache(cache, monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW_BACKFILL_JARS_DIR", "provided")
    assert delta_jars() == []
    monkeypatch.setenv("AIRFLOW_BACKFILL_S3A_JARS_DIR", str(tmp_path / "s3a"))
    (tmp_path / "s3a").mkdir()
    (tmp_path / "s3a" / "hadoop-aws-3.5.0.jar").write_text("")
    assert s3a_classpath_conf()["spark.driver.extraClassPath"] == str(tmp_path / "s3a" / "*")


def test_each_set_has_its_own_folder_named_by_its_pins(cache):
    folders = {jar_set.default_folder() for jar_set in (SPARK, S3A, KAFKA_BROKER)}
    assert len(folders) == 3
    assert all(Path(folder).name.split("-")[-1] == jar_set.pom_digest()[:12]
               for folder, jar_set in zip(sorted(folders), sorted((SPARK, S3A, KAFKA_BROKER),
                                                                   key=lambda s: s.default_folder()), strict=True))
    with pytest.raises(BackfillConfigError, match=r"airflow-backfill jars fetch --kafka-broker"):
        from airflow_backfill.kafka.loopback_broker import broker_classpath

        broker_classpath()
