"""The repository files a config target's factory imports, found by reading them, never running them.

A target's result is cached under the contents of these files (`qlint.run.cache`): a
commit that touches none of them answers from the cache without importing torch.
Every import statement of each file counts, inside functions too, resolved the
way `call_factory` imports: the config's folder first, then where Python would
find the top-level package; the `__init__.py` of every package on the way is a
dependency too (importing a submodule runs it). Modules outside the repository
count by their distribution's version. What import statements cannot show
(`importlib.import_module(name)`, `__import__`, `exec`, a change to `sys.path`) makes a
target uncacheable.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from qlint.io.reads import CONFIGURED, ReadError, read_input

MAX_FILES = 5000
# Calls that import what only running them tells: bare names, and methods (`importlib.import_module`,
# `runpy.run_path`); a method `.eval()` is `nn.Module.eval`, not the builtin.
_DYNAMIC_NAMES = {"__import__", "exec", "eval", "import_module"}
_DYNAMIC_METHODS = {"__import__", "import_module", "run_module", "run_path"}


@dataclass(frozen=True)
class Dependencies:
    files: dict[str, bytes]          # repository-relative path -> contents, every file the factory imports
    distributions: dict[str, str]    # top-level module outside the repository -> its distribution version
    uncacheable: str | None = None   # why the imports cannot be known without running them


class _Uncacheable(Exception):
    pass


def dependencies(module: str, base: Path, root: Path, file_bytes: int) -> Dependencies:
    """What importing `module` (as `call_factory` does, from `base`) reads from `root` and the environment."""
    walk = _Walk(base.resolve(), root.resolve(), file_bytes)
    try:
        walk.module(module)
        while walk.pending:
            walk.scan(*walk.pending.pop())
    except _Uncacheable as exc:
        return Dependencies({}, {}, str(exc))
    return Dependencies(dict(sorted(walk.files.items())), dict(sorted(walk.distributions.items())))


class _Walk:
    def __init__(self, base: Path, root: Path, file_bytes: int) -> None:
        self.base, self.root, self.file_bytes = base, root, file_bytes
        self.files: dict[str, bytes] = {}
        self.distributions: dict[str, str] = {}
        self.pending: list[tuple[Path, list[str]]] = []  # a file and the package its relative imports start at
        self.tops: dict[str, Path | None] = {}

    def module(self, name: str) -> bool:
        """Add the files importing `name` runs; False when it is not a module at all (`from a import f`)."""
        parts = name.split(".")
        where = self.top(parts[0])
        if where is None:
            return True  # outside the repository: counted by version in `top`
        for depth, part in enumerate(parts):
            if depth:
                where = where / part
            package = where / "__init__.py"
            if package.is_file():
                self.add(package, parts[: depth + 1])
            elif where.with_suffix(".py").is_file():
                self.add(where.with_suffix(".py"), parts[:depth])
                return depth == len(parts) - 1
            elif not where.is_dir():
                return False
        return True

    def top(self, name: str) -> Path | None:
        """The repository folder or file stem a top-level module is found at, or None when it is
        not in the repository (its distribution's version is recorded instead)."""
        if name in self.tops:
            return self.tops[name]
        found: Path | None = None
        if (self.base / name).is_dir() or (self.base / f"{name}.py").is_file():
            found = self.base / name
        elif name not in sys.stdlib_module_names and name not in sys.builtin_module_names:
            try:
                spec = importlib.util.find_spec(name)  # a top-level name: no package code runs
            except (ImportError, ValueError):
                spec = None
            origin = Path(spec.origin).resolve() if spec is not None and spec.has_location and spec.origin else None
            if origin is not None and origin.is_relative_to(self.root):
                found = origin.parent if origin.name == "__init__.py" else origin.with_suffix("")
            else:
                self.distributions[name] = _distribution_version(name)
        self.tops[name] = found
        return found

    def add(self, file: Path, package: list[str]) -> None:
        file = file.resolve()
        if not file.is_relative_to(self.root):
            raise _Uncacheable(f"{file} is imported from outside the repository through a link")
        key = file.relative_to(self.root).as_posix()
        if key in self.files:
            return
        if len(self.files) >= MAX_FILES:
            raise _Uncacheable(f"imports more than {MAX_FILES} repository files")
        try:
            self.files[key] = read_input(file, self.file_bytes, "module", CONFIGURED)
        except ReadError as exc:
            raise _Uncacheable(f"{key}: {exc}") from None
        self.pending.append((file, package))

    def scan(self, file: Path, package: list[str]) -> None:
        key = file.relative_to(self.root).as_posix()
        try:
            tree = ast.parse(self.files[key], filename=key)
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            raise _Uncacheable(f"{key} does not parse") from None
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    self.module(alias.name)
            elif isinstance(node, ast.ImportFrom):
                source = _absolute(node, package, key)
                if source and self.module(source):
                    for alias in node.names:
                        if alias.name != "*":
                            self.module(f"{source}.{alias.name}")
                elif not source:
                    for alias in node.names:
                        self.module(alias.name)
            elif isinstance(node, ast.Call) and _dynamic(node.func):
                raise _Uncacheable(f"{key}:{node.lineno} calls {ast.unparse(node.func)}(), "
                                   "so what it imports is known only by running it")
            elif _changes_sys_path(node):
                raise _Uncacheable(f"{key}:{getattr(node, 'lineno', 0)} changes sys.path, "
                                   "so where its imports come from is known only by running it")


def _absolute(node: ast.ImportFrom, package: list[str], where: str) -> str:
    if not node.level:
        return node.module or ""
    if node.level - 1 > len(package):
        raise _Uncacheable(f"{where}:{node.lineno}: relative import beyond the top-level package")
    parent = package[: len(package) - (node.level - 1)]
    return ".".join([*parent, *([node.module] if node.module else [])])


def _dynamic(func: ast.expr) -> bool:
    if isinstance(func, ast.Name):
        return func.id in _DYNAMIC_NAMES
    return isinstance(func, ast.Attribute) and func.attr in _DYNAMIC_METHODS


_LIST_CHANGES = {"insert", "append", "extend", "remove", "pop", "clear", "reverse", "sort", "__setitem__"}


def _is_sys_path(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "path" and ast.unparse(node.value) == "sys"


def _changes_sys_path(node: ast.AST) -> bool:
    """`sys.path.insert(...)` and the like, `sys.path = ...`, `sys.path[:] = ...`, `site.addsitedir(...)`."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        method = node.func.attr
        return (_is_sys_path(node.func.value) and method in _LIST_CHANGES) or method == "addsitedir"
    if isinstance(node, (ast.Assign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return any(_is_sys_path(t.value if isinstance(t, ast.Subscript) else t) for t in targets)
    return False


@lru_cache(maxsize=1)
def _top_level_distributions() -> dict[str, list[str]]:
    return dict(metadata.packages_distributions())


def _distribution_version(name: str) -> str:
    found = _top_level_distributions().get(name)
    if not found:
        return "unknown"
    return ",".join(sorted(f"{dist}=={metadata.version(dist)}" for dist in set(found)))
