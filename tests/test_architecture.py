"""The imports follow the layers: no module of the package imports, however indirectly, itself."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "qlint"


def imports_of(path: Path) -> set[str]:
    """Every qlint module `path` imports, at module level or inside functions and TYPE_CHECKING blocks."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("qlint"):
            names = [node.module] if node.module != "qlint" else [f"qlint.{a.name}" for a in node.names]
            found.update(n for n in names if (PACKAGE / f"{n.split('.', 1)[1]}.py").exists())
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("qlint."))
    return found - {f"qlint.{path.stem}"}


def import_graph() -> dict[str, set[str]]:
    return {f"qlint.{p.stem}": imports_of(p) for p in sorted(PACKAGE.glob("*.py"))}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for imported in sorted(graph.get(module, ())):
            if state.get(imported) == 1:
                return path[path.index(imported):] + [imported]
            if imported not in state and (cycle := visit(imported)):
                return cycle
        path.pop()
        state[module] = 2
        return None

    for module in graph:
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


def test_no_import_cycle_in_the_package() -> None:
    graph = import_graph()
    assert graph["qlint.engine"]  # the walk sees imports at all
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
