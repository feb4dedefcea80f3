"""docker/: what can be checked without a Docker engine (none runs where the tests run).

The image's files exist, its base is the Airflow and the Python the constraints test, its
services point at each other, and its steps are the commands the wheel test runs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
COMPOSE = ROOT / "docker" / "compose.yaml"


def instructions() -> list[tuple[str, str]]:
    """(instruction, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


def pinned(name: str) -> str:
    match = re.search(rf"^{re.escape(name)}==(\S+)$", (ROOT / "constraints-3.11.txt").read_text(), re.M)
    assert match, f"{name} is not pinned in constraints-3.11.txt"
    return match.group(1)


def test_every_file_the_image_copies_exists():
    copies = [shlex.split(arguments) for keyword, arguments in instructions() if keyword == "COPY"]
    assert copies
    for words in copies:
        if any(word.startswith("--from=") for word in words):
            continue
        sources = [word for word in words[:-1] if not word.startswith("--")]
        for source in sources:
            assert (ROOT / source).exists(), f"the Dockerfile copies {source}, which is not in the checkout"


def test_the_base_image_is_the_tested_airflow_and_python():
    [argument] = [arguments for keyword, arguments in instructions() if keyword == "ARG"]
    assert argument == f"AIRFLOW_IMAGE=apache/airflow:{pinned('apache-airflow')}-python3.11"
    assert [arguments for keyword, arguments in instructions() if keyword == "FROM"] == [
        "${AIRFLOW_IMAGE} AS build", "${AIRFLOW_IMAGE}"]
    assert f'"apache-airflow=={pinned("apache-airflow")}"' in DOCKERFILE.read_text()


def test_the_image_runs_the_wheel_tests_commands():
    runs = " ".join(arguments for keyword, arguments in instructions() if keyword == "RUN")
    wheel_test = (ROOT / "tests" / "e2e" / "test_wheel.py").read_text()
    assert "python -m build --no-isolation" in runs and '"-m", "build", "--no-isolation"' in wheel_test
    assert "airflow-backfill jars fetch --kafka-broker" in runs  # the jars, at build time
    assert "airflow-backfill jars fetch --check" in runs  # and the image's copy is current
    assert "openjdk-17-jre-headless" in runs and "openjdk-17-jdk-headless" in runs
    assert "lazy_discover_providers" not in DOCKERFILE.read_text().lower()  # the plugin's entry point suffices


def test_compose_runs_airflow_against_the_spark_master_and_workers():
    compose = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    assert set(services) == {"spark-master", "spark-worker", "airflow"}
    for name, service in services.items():
        assert service["build"] == {"context": "..", "dockerfile": "docker/Dockerfile"}, name
        assert (COMPOSE.parent / service["build"]["context"] / service["build"]["dockerfile"]).resolve() == DOCKERFILE
        assert "data:/data" in service["volumes"], name
    master = " ".join(services["spark-master"]["command"])
    assert "deploy.master.Master --host spark-master --port 7077" in master
    assert "spark://spark-master:7077" in " ".join(services["spark-worker"]["command"])
    assert services["spark-worker"]["deploy"]["replicas"] == 2
    airflow = services["airflow"]
    assert airflow["command"] == ["standalone"]
    assert airflow["environment"]["AIRFLOW_CONN_SPARK_DEFAULT"] == "spark://spark-master:7077?deploy-mode=client"
    assert set(airflow["depends_on"]) == {"spark-master", "spark-worker"}
    assert "data" in compose["volumes"]
    assert "AIRFLOW_BACKFILL_HOME=/data" in DOCKERFILE.read_text().replace(" ", "")
