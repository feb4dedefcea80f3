"""The distribution installs into an existing Airflow: compatible ranges in setup.cfg,
the tested set in the constraints file, every import declared, and the spark-submit
entry points inside the package's namespace."""

from __future__ import annotations

import ast
import configparser
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "constraints-3.11.txt"


def setup_cfg() -> configparser.ConfigParser:
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    return parser


def requirements(section: str, key: str) -> list[Requirement]:
    lines = setup_cfg()[section][key].strip().splitlines()
    return [Requirement(line.strip()) for line in lines if line.strip() and not line.strip().startswith("#")]


def constraints() -> dict[str, str]:
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonical(name)] = version.strip()
    return pins


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_install_requires_are_ranges_not_pins():
    for requirement in requirements("options", "install_requires"):
        operators = {spec.operator for spec in requirement.specifier}
        assert "==" not in operators and "===" not in operators, f"{requirement} pins an exact version"
        assert any(op.startswith(">") for op in operators), f"{requirement} has no minimum version"


def test_the_constraints_pin_every_requirement_inside_its_range():
    pins = constraints()
    extras = setup_cfg()["options.extras_require"]
    declared = requirements("options", "install_requires") + [
        requirement for extra in extras for requirement in requirements("options.extras_require", extra)
    ]
    for requirement in declared:
        version = pins.get(canonical(requirement.name))
        assert version is not None, f"{requirement.name} is not in {CONSTRAINTS.name}"
        assert requirement.specifier.contains(version, prereleases=True), (
            f"{CONSTRAINTS.name} pins {requirement.name}=={version}, outside {requirement}")


def declared_pythons() -> list[str]:
    """The minor versions setup.cfg's python_requires admits, among those Airflow 3 supports."""
    from packaging.specifiers import SpecifierSet

    admitted = SpecifierSet(setup_cfg()["options"]["python_requires"])
    return [version for version in ("3.10", "3.11", "3.12", "3.13", "3.14") if admitted.contains(f"{version}.0")]


def test_every_declared_python_is_one_every_requirement_accepts():
    """A Python the provider declares must be one its requirements install on: the Spark
    provider 6.3.4 requires 3.11, which rules out 3.10 whatever the provider's own code says."""
    from packaging.specifiers import SpecifierSet

    pythons = declared_pythons()
    assert pythons == ["3.11", "3.12", "3.13"]
    refused = []
    for requirement in requirements("options", "install_requires"):
        requires_python = importlib.metadata.metadata(requirement.name).get("Requires-Python")
        for version in pythons:
            if requires_python and not SpecifierSet(requires_python).contains(f"{version}.0"):
                refused.append(f"{requirement.name} requires Python {requires_python}, not {version}")
    assert not refused
    classifiers = setup_cfg()["metadata"]["classifiers"]
    assert [line.rsplit(" ", 1)[-1] for line in classifiers.splitlines()
            if line.strip().startswith("Programming Language :: Python :: 3.")] == pythons
    test_script = (ROOT / "scripts" / "test.sh").read_text()
    assert f"for version in {' '.join(pythons)}; do" in test_script


def test_the_python_delta_spark_matches_the_jars():
    pom = (ROOT / "airflow_backfill" / "jvm" / "poms" / "spark.xml").read_text()
    jar_version = re.search(r"<delta.version>([^<]+)</delta.version>", pom).group(1)
    assert constraints()["delta-spark"] == jar_version
    assert constraints()["pyspark"] == constraints()["pyspark-client"]


def test_demo_tools_are_an_extra_not_a_runtime_dependency():
    runtime = {canonical(r.name) for r in requirements("options", "install_requires")}
    assert "tpchgen-cli" not in runtime
    assert "tpchgen-cli" in {canonical(r.name) for r in requirements("options.extras_require", "demo")}


OPTIONAL_MODULES = {"lineage.py": "openlineage", "lease.py": "s3"}
"""Modules only imported when an extra is installed, and that extra."""


def third_party_imports(path: Path) -> set[str]:
    """Top-level modules a file imports, besides the standard library and the package."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"__future__", "airflow_backfill"}


def test_every_imported_distribution_is_declared():
    runtime = {canonical(r.name) for r in requirements("options", "install_requires")}
    providers = importlib.metadata.packages_distributions()
    undeclared = {}
    for path in [*(ROOT / "airflow_backfill").rglob("*.py"), *(ROOT / "spark_jobs").glob("*.py")]:
        declared = set(runtime)
        if path.name in OPTIONAL_MODULES:
            extra = OPTIONAL_MODULES[path.name]
            declared |= {canonical(r.name) for r in requirements("options.extras_require", extra)}
        for module in third_party_imports(path):
            # `airflow` is shared by apache-airflow and the distributions it pulls in
            distributions = {canonical(name) for name in providers.get(module, [])}
            assert distributions, f"{module} is imported but no installed distribution provides it"
            if not distributions & declared:
                undeclared[f"{path.name}: {module}"] = sorted(distributions)
    assert not undeclared, f"imported but not declared in setup.cfg: {undeclared}"


def test_spark_jobs_are_installed_inside_the_package_namespace(tmp_path):
    probe = (
        "import importlib.util as u, pathlib; "
        "spec = u.find_spec('airflow_backfill.spark_jobs.forward'); "
        "print(pathlib.Path(spec.origin).resolve()); "
        "print(u.find_spec('spark_jobs'))"
    )
    lines = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True,
                           check=True, timeout=60).stdout.splitlines()
    assert lines == [str((ROOT / "spark_jobs" / "forward.py").resolve()), "None"]
