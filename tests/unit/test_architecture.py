"""The package's layers: each subpackage imports only from itself and the layers below it, the
import graph has no cycle, and torch is imported at module level only where the table allows."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "qlint"

# Bottom to top: a subpackage may import itself and what is listed before it. `_compat` and the
# package root are below everything; `api` and `__main__` are above everything.
LAYERS = ("io", "rules", "records", "settings", "static", "loading", "analysis", "device", "full", "fix", "remedies",
          "report", "run", "cli")
BOTTOM = {"qlint", "qlint._compat"}
TOP = {"qlint.api", "qlint.__main__"}
# Where `import torch` (executorch, torchao) may stand at module level. Everything else imports the
# stack inside the function that needs it, so `--help`, `rules`, `rule` and `--static` stay torch-free.
TORCH_AT_MODULE_LEVEL = {"loading", "analysis", "device", "full", "fix", "remedies"}
STACK = ("torch", "executorch", "torchao")
# The module the forkserver imports by name (`run.isolation`) so that every child starts with the stack
# loaded: the one module outside those packages that loads it as it is imported. No module imports it.
FORKSERVER_PRELOAD = "qlint.run.preload"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported(node: ast.AST) -> list[str]:
    """The modules one import statement names (a `from X import y` names X.y when that is a module)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in MODULES]
        return subs or [node.module]
    return []


def imports_of(path: Path, module_level_only: bool = False) -> set[str]:
    """Every module `path` imports: at module level, or also inside functions and TYPE_CHECKING blocks."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    found = {name for node in nodes for name in imported(node)}
    return found - {module_name(path)}


def qlint_graph(module_level_only: bool = False) -> dict[str, set[str]]:
    return {m: {i for i in imports_of(p, module_level_only) if i in MODULES} for m, p in MODULES.items()}


def layer(module: str) -> int:
    if module in BOTTOM:
        return -1
    if module in TOP:
        return len(LAYERS)
    return LAYERS.index(module.split(".")[1])


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for imported_ in sorted(graph.get(module, ())):
            if state.get(imported_) == 1:
                return path[path.index(imported_):] + [imported_]
            if imported_ not in state and (cycle := visit(imported_)):
                return cycle
        path.pop()
        state[module] = 2
        return None

    for module in graph:
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


def test_every_module_belongs_to_a_layer() -> None:
    assert {m.split(".")[1] for m in MODULES if m not in BOTTOM | TOP} == set(LAYERS)
    for package in LAYERS:
        assert ast.get_docstring(ast.parse((PACKAGE / package / "__init__.py").read_text())), package


def test_no_subpackage_imports_a_layer_above_it() -> None:
    graph = qlint_graph()
    assert graph["qlint.run.engine"]  # the walk sees imports at all
    upward = sorted(f"{m} -> {i}" for m, imports in graph.items() for i in imports if layer(i) > layer(m))
    assert upward == []


def test_no_import_cycle_in_the_package() -> None:
    graph = qlint_graph()
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_the_stack_is_imported_at_module_level_only_where_the_table_allows() -> None:
    direct = {m for m, p in MODULES.items() if any(i.split(".")[0] in STACK for i in imports_of(p, True))}
    assert direct and all(m.split(".")[1] in TORCH_AT_MODULE_LEVEL for m in direct), sorted(direct)
    # Nor through another qlint module: what a torch-free layer loads at import time is torch-free.
    graph = qlint_graph(module_level_only=True)
    for module in MODULES:
        if module in TOP or module in BOTTOM or module.split(".")[1] in TORCH_AT_MODULE_LEVEL:
            continue
        seen, todo = set(), [module]
        while todo:
            current = todo.pop()
            assert current not in direct, f"{module} imports the stack at module level through {current}"
            todo.extend(graph[current] - seen)
            seen |= graph[current]


def test_importing_a_module_outside_those_packages_never_loads_the_stack() -> None:
    """What the walk above cannot see, a module-level call that loads the stack (`stack.load()`), a
    fresh interpreter does: it imports every module outside the table's packages and the stack stays
    unloaded. The forkserver's preload loads it, and is imported by name only, never by a module."""
    import subprocess
    import sys

    probe = ("import importlib, sys\n"
             "for name in sys.argv[1:]:\n"
             "    importlib.import_module(name)\n"
             f"    if loaded := sorted(set({STACK!r}) & set(sys.modules)):\n"
             "        print(name, 'loads', *loaded)\n"
             "        break\n")
    outside = sorted(m for m in MODULES if m not in TOP | {FORKSERVER_PRELOAD}
                     and (m in BOTTOM or m.split(".")[1] not in TORCH_AT_MODULE_LEVEL))
    assert len(outside) > 40 and "qlint.run.engine" in outside
    result = subprocess.run([sys.executable, "-c", probe, *outside], capture_output=True, text=True, cwd=ROOT,
                            timeout=120)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    preload = ast.parse(MODULES[FORKSERVER_PRELOAD].read_text()).body
    assert any(ast.unparse(node) == "stack.load()" for node in preload)
    assert not [m for m, imports in qlint_graph().items() if FORKSERVER_PRELOAD in imports]
    assert f'"{FORKSERVER_PRELOAD}"' in MODULES["qlint.run.isolation"].read_text()


def test_the_layer_checks_find_what_they_look_for() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    assert layer("qlint.io.reads") < layer("qlint.loading.view") < layer("qlint.cli.main")
    assert "torch" in imports_of(PACKAGE / "loading" / "view.py", module_level_only=True)
    assert "torch" not in imports_of(PACKAGE / "cli" / "main.py", module_level_only=True)


def test_no_reporter_constructs_a_finding() -> None:
    """Rules run where rules run (the tiers, `full.over_budget`, `run.suppressions`); `report/` formats."""
    for name, path in MODULES.items():
        if name.startswith("qlint.report"):
            calls = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)
                     and isinstance(n.func, ast.Name) and n.func.id == "Finding"]
            assert not calls, name


def test_the_architecture_page_draws_the_package_as_it_is() -> None:
    """docs/architecture.md line by line where a test can read it: its layer line is `LAYERS`, the
    packages it says import the stack at module level are `TORCH_AT_MODULE_LEVEL`, every module its
    flow diagram names exists, and its package list names every module by its full path (a module it
    lists under one package's heading exists there; a module of the package is listed)."""
    import re

    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    layer_line, flow = re.findall(r"```\n(.*?)```", page, re.S)[:2]
    assert [part.strip() for part in layer_line.split("─>")] == [*LAYERS[:-1], "cli, api"]
    said = re.search(r"imported at module level only\s+in (.*?), directly.*?the one other module that loads "
                     r"them\s+as it is imported is `(\w+)/(\w+)\.py`", page, re.S)
    assert said is not None and set(re.findall(r"`(\w+)/`", said[1])) == TORCH_AT_MODULE_LEVEL
    assert f"qlint.{said[2]}.{said[3]}" == FORKSERVER_PRELOAD
    named = set(re.findall(rf"\b((?:{'|'.join(LAYERS)})\.\w+)", flow))
    assert len(named) > 15 and sorted(n for n in named if f"qlint.{n}" not in MODULES) == []
    listed = listed_modules(page)
    assert sorted(path for path in listed if not (ROOT / path).exists()) == []
    unlisted = {path.relative_to(ROOT).as_posix() for path in MODULES.values()} - listed - UNLISTED
    assert sorted(unlisted) == []


# Package files the module list has no line for: the packages' docstrings and the entry point say what they are.
UNLISTED = {"qlint/__init__.py", "qlint/__main__.py", "qlint/_compat.py"} | {
    path.relative_to(ROOT).as_posix() for path in PACKAGE.rglob("__init__.py")}


def listed_modules(page: str) -> set[str]:
    """The modules docs/architecture.md's package list names, by full path: a `name.py` in a bullet
    under the heading **`qlint/<package>/`** is `qlint/<package>/name.py`, or, in a bullet for a
    folder (`- `commands/`: ...`), a module in that folder; `**`qlint/api.py`**` names itself."""
    import re

    modules, package = set(), None
    section = page.split("## Packages and modules", 1)[1].split("\n## ", 1)[0]
    for bullet in re.split(r"\n(?=- |\*\*|\n)", section):
        if heading := re.match(r"\*\*`(qlint/(?:\w+/)?)`", bullet):
            package = heading[1]
        elif heading := re.match(r"\*\*`(qlint/\w+\.py)`", bullet):
            modules.add(heading[1])
            package = None
        elif package and bullet.startswith("- "):
            folder = re.match(r"- `(\w+/)`:", bullet)
            where = package + (folder[1] if folder else "")
            modules |= {where + name for name in re.findall(r"`(\w+\.py)`", bullet)}
    return modules
