"""The `channels-last` remedy: export the model and its 4-D inputs in channels_last, the layout
`CortexMConv2DCheck` wants, so the quantizer annotates the convolutions it left NCHW.

It changes what a target's factory returns, so `--write patch:` can write it into the factory:
before each `return model, example[, calibration]` of plain names, the three are moved to
channels_last. The factory's file is parsed, never imported.
"""

from __future__ import annotations

import ast
import copy
from typing import Any

from qlint.loading import stack

stack.load()

import torch  # noqa: E402

from qlint.remedies.remedy import Build, Remedy, call_nodes  # noqa: E402
from qlint.settings.config import RemedyName  # noqa: E402

_LAST = "memory_format=torch.channels_last"


class ChannelsLast(Remedy):
    """Export the module and its 4-D inputs in channels_last, the layout CortexMConv2DCheck accepts."""

    name = RemedyName.CHANNELS_LAST
    edits_factory = True
    user_change = (
        "model = model.to(memory_format=torch.channels_last)",
        "example_inputs = tuple(x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x "
        "for x in example_inputs)  # and every calibration batch; the application feeds NHWC data",
    )

    def not_applicable(self, graph: Any) -> str | None:
        convs = call_nodes(graph, torch.ops.aten.conv2d.default)
        if not convs:
            return "the model has no 2-D convolution"
        if all(n.args[0].meta["val"].is_contiguous(memory_format=torch.channels_last) for n in convs):
            return "every 2-D convolution already reads channels_last tensors"
        return None

    def on_inputs(self, batch: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(
            t.contiguous(memory_format=torch.channels_last) if isinstance(t, torch.Tensor) and t.dim() == 4 else t
            for t in batch
        )

    def on_build(self, build: Build) -> Build:
        model = copy.deepcopy(build.model).to(memory_format=torch.channels_last)
        return Build(model, self.on_inputs(build.example), tuple(self.on_inputs(b) for b in build.calibration))

    def edit_factory(self, source: str, function: str) -> list[str] | str:
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
