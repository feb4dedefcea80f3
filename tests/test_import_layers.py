"""The package's import graph has no circles, between modules or between the engine's
folders, and no module takes another folder's `_private` names: shared primitives live one
floor below the code that uses them (docs/contributing.md, "The engine's floors").

Every import counts, lazy ones and those under `TYPE_CHECKING` too: a circle a reader
must follow is a circle, whenever Python resolves it."""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "airflow_backfill"


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


def test_the_check_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
