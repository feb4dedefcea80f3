"""The package's import graph has no circles, between modules or between the engine's
folders, and no module takes another folder's `_private` names: shared primitives live one
floor below the code that uses them (docs/contributing.md, "The engine's floors").

The package's own folders stand in one order (`FOLDER_ORDER`, bottom first): a folder
never imports one above it. The engine and the `spark-submit` entry points never import
Airflow, so that a phase's driver and the engine's tests run without it.

Every import counts, lazy ones and those under `TYPE_CHECKING` too: a circle a reader
must follow is a circle, whenever Python resolves it."""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "airflow_backfill"
SPARK_JOBS = PACKAGE.parent / "spark_jobs"

FOLDER_ORDER = ("jvm", "storage", "engine", "kafka", "hooks", "triggers", "sensors", "links", "shared_forward",
                "operators", "plugins")
"""The package's folders, bottom first. `jvm/` finds the jars Spark loads; `storage/` reads
and writes files on any store; the engine computes MVs on it; `kafka/` is the engine of
Kafka upstreams; then Airflow's parts: hooks, the triggers that use them, the sensors that
defer to the triggers, the extra links, the shared forward's members, the operators that
run everything below, and the UI plugin. Modules directly in the package (`job.py`, `exceptions.py`, `task_group.py`,
`cli.py`, ...) are not ranked: the circle checks cover them."""
AIRFLOW_SIDE = ("hooks", "triggers", "sensors", "links", "operators", "plugins", "task_group", "kafka_task_group",
                "folder_dags", "job_input", "lineage", "cli", "kafka_cli", "jars_cli")
"""What the `spark-submit` entry points never import: Airflow's side of the package."""


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _imports(module: str) -> Iterable[tuple[str, str]]:
    """(imported module, imported name or '') of every `airflow_backfill` import in `module`."""
    tree = ast.parse(MODULES[module].read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PACKAGE.name):
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                yield (child, "") if child in MODULES else (node.module, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(PACKAGE.name):
                    yield alias.name, ""


def _edges(unit_of: callable) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for module in MODULES:
        for imported, _ in _imports(module):
            if imported in MODULES and unit_of(imported) != unit_of(module):
                edges[unit_of(module)].add(unit_of(imported))
    return edges


def circles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of more than one node (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(edges.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            part = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                part.append(member)
                if member == node:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for node in sorted(set(edges) | {n for targets in edges.values() for n in targets}):
        if node not in index:
            visit(node)
    return found


def engine_floor(module: str) -> str:
    """The engine's unit a module belongs to: its folder (`engine.delta`), or itself for a
    module directly in `engine/`; outside the engine, the module itself."""
    parts = module.split(".")
    if parts[:2] == [PACKAGE.name, "engine"] and len(parts) > 3:
        return ".".join(parts[:3])
    return module


def test_no_module_imports_another_in_a_circle():
    assert circles(_edges(lambda module: module)) == []


def test_the_engines_folders_stand_on_each_other_without_circles():
    assert circles(_edges(engine_floor)) == []


def test_no_module_takes_another_folders_private_names():
    taken = [
        f"{module} imports {name} from {imported}"
        for module in MODULES for imported, name in _imports(module)
        if name.startswith("_") and not name.startswith("__")
        and imported.rpartition(".")[0] != module.rpartition(".")[0]
    ]
    assert taken == []


def package_folder(module: str) -> str | None:
    """The package's folder a module lives in (`engine` for `airflow_backfill.engine.delta.log`),
    or None for a module directly in the package."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and (PACKAGE / parts[1]).is_dir() else None


def upward_imports(edges: Iterable[tuple[str, str]]) -> list[str]:
    """Each (module, imported module) pair in which a folder imports one above it."""
    rank = {folder: place for place, folder in enumerate(FOLDER_ORDER)}
    found = []
    for module, imported in edges:
        mine, theirs = package_folder(module), package_folder(imported)
        if mine in rank and theirs in rank and rank[theirs] > rank[mine]:
            found.append(f"{module} ({mine}/) imports {imported} ({theirs}/), which stands above it")
    return found


def test_every_folder_of_the_package_is_ranked():
    folders = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert folders - {"spark_jobs"} == set(FOLDER_ORDER)


def test_no_folder_imports_one_above_it():
    edges = [(module, imported) for module in MODULES for imported, _ in _imports(module) if imported in MODULES]
    assert upward_imports(edges) == []


def test_the_folder_check_finds_an_upward_import():
    edges = [("airflow_backfill.kafka.cli", "airflow_backfill.operators.kafka"),
             ("airflow_backfill.operators.kafka", "airflow_backfill.kafka.config")]
    assert upward_imports(edges) == [
        "airflow_backfill.kafka.cli (kafka/) imports airflow_backfill.operators.kafka (operators/), "
        "which stands above it"]


def airflow_imports(path: Path) -> list[str]:
    """Every `import airflow...` / `from airflow... import` in a file, lazy ones included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else (
            [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
        found += [f"{path.name}:{node.lineno} {name}" for name in names if name.split(".")[0] == "airflow"]
    return found


def test_the_engine_never_imports_airflow():
    found = [hit for path in sorted((PACKAGE / "engine").rglob("*.py")) for hit in airflow_imports(path)]
    assert found == []


def test_the_airflow_check_finds_an_import(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import os\n\ndef f():\n    from airflow.sdk import BaseHook\n    import airflow.models\n")
    assert airflow_imports(probe) == ["probe.py:4 airflow.sdk", "probe.py:5 airflow.models"]


def spark_job_imports() -> list[tuple[str, str]]:
    """(entry point file, imported module) of every import in `spark_jobs/`."""
    found = []
    for path in sorted(SPARK_JOBS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found += [(path.name, alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found += [(path.name, node.module) for alias in node.names]
    return found


def test_spark_jobs_import_only_the_engine_and_shared_helpers():
    """A phase's driver runs in spark-submit, where Airflow may not even be installed."""
    wrong = sorted({
        f"{name} imports {module}" for name, module in spark_job_imports()
        if module.split(".")[0] == "airflow"
        or (module.startswith(f"{PACKAGE.name}.") and module.split(".")[1] in AIRFLOW_SIDE)
    })
    assert wrong == []


def test_the_check_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
