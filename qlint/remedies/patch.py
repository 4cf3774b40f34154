"""A kept remedy as a unified diff of the target's factory, when the change is mechanical.

Only `channels-last` changes what a factory returns, so only it can be written as
a change to the factory: before each `return model, example[, calibration]` of
plain names, the three are moved to channels_last. The other remedies belong in
the user's export script, which qlint does not know; their lines are printed.
The factory's file is parsed, never imported, and never written: the diff goes
to the path the user names with `--write patch:PATH`.
"""

from __future__ import annotations

import ast
import difflib
from dataclasses import dataclass
from pathlib import Path

from qlint.io.reads import ReadError, read_input
from qlint.rules.records import RemedyReport, RemedyStatus
from qlint.settings.config import RemedyName

SOURCE_MAX_BYTES = 1 << 20
_LAST = "memory_format=torch.channels_last"


@dataclass(frozen=True)
class Patch:
    diff: str          # unified diff, "" when nothing is mechanical
    notes: list[str]   # per target: what was written, or why not


def _returns(function: ast.FunctionDef) -> list[ast.Return]:
    """The function's own return statements (not those of functions or classes inside it)."""
    found: list[ast.Return] = []
    pending: list[ast.AST] = list(function.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Return):
            found.append(node)
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            pending.extend(ast.iter_child_nodes(node))
    return found


def _imports_torch(tree: ast.Module) -> bool:
    return any(isinstance(n, ast.Import) and any(a.name == "torch" and a.asname is None for a in n.names)
               for n in tree.body)


def _channels_last_lines(names: list[str], indent: str, import_torch: bool) -> list[str]:
    model, example, *rest = names
    moved = f"tuple(t.contiguous({_LAST}) if t.dim() == 4 else t for t in {{}})"
    lines = [f"{indent}import torch\n"] if import_torch else []
    lines.append(f"{indent}{model} = {model}.to({_LAST})\n")
    lines.append(f"{indent}{example} = {moved.format(example)}\n")
    if rest:
        lines.append(f"{indent}{rest[0]} = [{moved.format('batch')} for batch in {rest[0]}]\n")
    return lines


def channels_last(source: str, function: str) -> list[str] | str:
    """The factory's file with channels_last moves before each return, or why that is not mechanical."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return f"cannot parse it: {exc.msg} (line {exc.lineno})"
    except (ValueError, RecursionError, MemoryError) as exc:  # null bytes, nesting beyond the parser
        return f"cannot parse it: {type(exc).__name__}"
    factory = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function), None)
    if factory is None:
        return f"no module-level `def {function}` in it"
    returns = _returns(factory)
    if not returns:
        return f"{function} has no return statement"
    lines = source.splitlines(keepends=True)
    for statement in sorted(returns, key=lambda r: r.lineno, reverse=True):  # bottom up: line numbers hold
        value = statement.value
        if not (isinstance(value, ast.Tuple) and len(value.elts) in (2, 3)
                and all(isinstance(e, ast.Name) for e in value.elts)):
            return (f"line {statement.lineno} does not return `model, example_inputs[, calibration]` "
                    "as plain names")
        names = [e.id for e in value.elts if isinstance(e, ast.Name)]
        line = lines[statement.lineno - 1]
        indent = line[: len(line) - len(line.lstrip())]
        lines[statement.lineno - 1:statement.lineno - 1] = _channels_last_lines(
            names, indent, not _imports_torch(tree))
    return lines


def remedy_patch(reports: list[RemedyReport], root: Path) -> Patch:
    """One unified diff over every target whose kept remedies include `channels-last`."""
    edited: dict[Path, tuple[list[str], list[str]]] = {}
    notes: list[str] = []
    done: set[tuple[Path, str]] = set()
    for report in reports:
        kept = {o.remedy for o in report.outcomes if o.status == RemedyStatus.KEPT}
        if RemedyName.CHANNELS_LAST not in kept:
            if kept:
                notes.append(f"{report.artifact}: {', '.join(sorted(kept))} change the export script, "
                             "not the factory: add the printed lines by hand")
            continue
        if not report.factory_file:
            notes.append(f"{report.artifact}: the factory's file is not known")
            continue
        path = Path(report.factory_file)
        if (path, report.factory) in done:  # two targets of one factory: one change
            continue
        done.add((path, report.factory))
        try:
            if path not in edited:
                text = read_input(path, SOURCE_MAX_BYTES, "factory source").decode("utf-8")
                edited[path] = (text.splitlines(keepends=True), text.splitlines(keepends=True))
        except (ReadError, UnicodeDecodeError) as exc:
            notes.append(f"{report.artifact}: cannot read {path.name}: {exc}")
            continue
        changed = channels_last("".join(edited[path][1]), report.factory.rsplit(":", 1)[1])
        if isinstance(changed, str):
            notes.append(f"{report.artifact}: channels-last is not mechanical in {path.name}: {changed}")
            continue
        edited[path] = (edited[path][0], changed)
        notes.append(f"{report.artifact}: channels-last written as a change to {path.name}")
    diff: list[str] = []
    for path, (before, after) in edited.items():
        if before == after:
            continue
        name = path.resolve().relative_to(root.resolve()).as_posix() if path.resolve().is_relative_to(
            root.resolve()) else path.name
        diff.extend(difflib.unified_diff(before, after, f"a/{name}", f"b/{name}"))
    return Patch("".join(diff), notes)
