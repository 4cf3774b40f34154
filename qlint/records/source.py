"""Map a graph node back to the line of the user's model source that created it."""

from __future__ import annotations

import importlib.util
import re
import sys
import sysconfig
from functools import lru_cache
from pathlib import Path
from typing import Any

from qlint.io.reads import printable, shown_path
from qlint.records.results import Location

# A stack trace comes from the artifact: a line number is at most 9 digits, a path at most 4096 characters.
_FRAME = re.compile(r'^\s*File "(?P<path>[^"]{1,4096})", line (?P<line>\d{1,9}), in (?P<func>.*)$')
# Frames in these packages are the framework, not the model author's code.
_FRAMEWORK_PACKAGES = ("torch", "executorch", "torchao", "qlint", "_pytest", "pluggy")


@lru_cache(maxsize=1)
def _framework_roots() -> tuple[str, ...]:
    """Folders of the framework packages and the standard library (located, not imported)."""
    roots = [sysconfig.get_paths()["stdlib"]]
    for name in _FRAMEWORK_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            roots.extend(spec.submodule_search_locations)
    return tuple(str(Path(r).resolve()) + "/" for r in roots)


def _is_framework(path: str) -> bool:
    if path.startswith("<"):
        return True
    if "site-packages" in path and not any(f"/{p}/" in path for p in _FRAMEWORK_PACKAGES):
        return False
    return path.startswith(_framework_roots()) or any(
        f"site-packages/{p}/" in path for p in _FRAMEWORK_PACKAGES
    )


def user_frame(stack_trace: str | None) -> tuple[str, int, str] | None:
    """The innermost frame of a node's stack trace outside torch, executorch and qlint."""
    if not stack_trace:
        return None
    lines = stack_trace.splitlines()
    found = None
    for i, text in enumerate(lines):
        match = _FRAME.match(text)
        if not match or _is_framework(match["path"]):
            continue
        code = lines[i + 1].strip() if i + 1 < len(lines) and not _FRAME.match(lines[i + 1]) else ""
        found = (match["path"], int(match["line"]), code)
    return found


def display_path(path: str, root: Path) -> str:
    """Relative to the repo root when inside it, else relative to its sys.path entry."""
    p = Path(path)
    if not p.is_absolute():
        return p.as_posix()  # already relative to the repo (bundled examples)
    inside = shown_path(p, root, resolve=True)
    if inside is not None:
        return inside
    for entry in sorted((Path(e) for e in sys.path if e), key=lambda e: len(str(e)), reverse=True):
        if "site-packages" in entry.parts and p.is_relative_to(entry):
            return p.relative_to(entry).as_posix()
    return p.as_posix()


def locate(stack_trace: str | None, root: Path) -> Location | None:
    frame = user_frame(stack_trace)
    if frame is None:
        return None
    path, line, code = frame
    absolute = Path(path) if Path(path).is_absolute() else root / path
    try:
        absolute = absolute.resolve()
    except (OSError, RuntimeError):  # a symlink loop named by the artifact
        pass
    return Location(printable(display_path(path, root)), line, printable(code), str(absolute))


def module_path(nn_module_stack: Any) -> str | None:
    """`layers.0.self_attn (MultiheadAttention)`: the innermost module that made a node, for nodes
    whose stack trace has no frame in the user's code (code inside torch, nn.MultiheadAttention)."""
    if not isinstance(nn_module_stack, dict) or not nn_module_stack:
        return None
    entry = list(nn_module_stack.values())[-1]
    if not isinstance(entry, tuple) or len(entry) != 2:
        return None
    path, kind = entry
    name = getattr(kind, "__name__", None) or str(kind).rsplit(".", 1)[-1].rstrip("'>")
    path = str(path).replace("L['self'].", "") or "the model"
    return printable(f"{path[:200]} ({name[:80]})")


def module_name(node: Any) -> str | None:
    """The path of the module whose forward created a graph node (`encoder.layers.0.norm1`), when
    export recorded it (`nn_module_stack`): the user's own name for where an op comes from."""
    stack = node.meta.get("nn_module_stack") or {}
    paths = [path for path, _ in stack.values() if path]
    return paths[-1] if paths else None
