"""Run an island on every integer its input can hold, with the graph's own ops.

This is what makes "exact" checkable: for an island with one runtime input, the
map from input integers to output integers is finite (256 values for int8,
65536 for int16), so it can be computed completely rather than sampled.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Node

from qlint.analysis.islands import Island
from qlint.loading.view import (
    GraphView,
    Kind,
    base_name,
    input_node,
    op_name,
    output_dtype,
    output_value,
    run_node,
    torch_dtype,
)
from qlint.rules.qparams import QParams

# Ops that act on each element alone: shape ops around them may be skipped when
# evaluating on a flat vector of all input values.
ELEMENTWISE = {
    "div", "mul", "add", "sub", "rsub", "abs", "neg", "reciprocal", "sqrt", "rsqrt", "exp",
    "log", "pow", "clamp", "clamp_min", "clamp_max", "relu", "sigmoid", "tanh", "hardtanh",
    "minimum", "maximum", "square", "where",
}


def all_values(dtype: torch.dtype) -> torch.Tensor:
    info = torch.iinfo(dtype)
    return torch.arange(info.min, info.max + 1, dtype=torch.int64).to(dtype)


def input_domain(qp: QParams) -> tuple[torch.Tensor, torch.Tensor]:
    """Every value of the input dtype, and the mask of those a producer clamped
    to [qmin, qmax] can actually emit (an int16 range of [-32767, 32767] never
    carries -32768)."""
    values = all_values(torch_dtype(qp))
    return values, (values >= qp.qmin) & (values <= qp.qmax)


def runtime_input(view: GraphView, island: Island) -> Node | None:
    """The island's only non-constant input, when it is a dequantize node."""
    runtime = [n for n in island.inputs if not view.is_constant(n)]
    if len(runtime) == 1 and view.kind(runtime[0]) == Kind.DEQUANTIZE:
        return runtime[0]
    return None


def not_per_integer(view: GraphView, island: Island) -> str | None:
    """Why the island is not one function applied to each input integer alone; None when it is.

    Only then does running it on a flat vector of every integer describe it:
    a non-elementwise op, a constant that differs by position, or a constant
    that broadcasts the input to a larger shape each break that.
    """
    for node in island.compute:
        if base_name(op_name(node)) not in ELEMENTWISE:
            return f"not an elementwise function of its input ({op_name(node)})"
        for arg in node.args:
            constant = view.constant(arg) if isinstance(arg, Node) else None
            if constant is not None and constant.uniform() is None:
                return f"per-channel constant {constant.name} ({constant.numel} elements)"
        runtime = [a for a in node.all_input_nodes if view.constant(a) is None]
        shape = getattr(output_value(node), "shape", None)
        if runtime and shape != getattr(output_value(runtime[0]), "shape", None):
            return f"{op_name(node)} broadcasts its input to a larger shape"
    return None


def _arg(view: GraphView, env: dict[Node, torch.Tensor], arg: Any) -> Any:
    if isinstance(arg, Node):
        if arg in env:
            return env[arg]
        constant = view.constant(arg)
        value = None if constant is None else constant.uniform()
        if value is None:
            raise ValueError(f"operand {arg.name} is neither computed nor one constant value")
        return value
    if isinstance(arg, (list, tuple)):
        return type(arg)(_arg(view, env, a) for a in arg)
    return arg


def evaluate(view: GraphView, island: Island, dq: Node, values: torch.Tensor) -> dict[Node, torch.Tensor]:
    """Integer outputs of each quantize consumer for the given input integers.

    Only meaningful where `not_per_integer` is None: shape ops are treated as
    identity on the flat vector of inputs, constants as their one value.
    """
    env: dict[Node, torch.Tensor] = {dq: run_node(dq, values, *dq.args[1:], **dq.kwargs)}
    for node in island.nodes:
        if node not in island.compute:  # data movement, or a dtype conversion that rounds
            source, dtype = env[input_node(node)], output_dtype(node)
            env[node] = source.to(dtype) if dtype is not None and dtype != source.dtype else source
            continue
        args = _arg(view, env, node.args)
        kwargs = {k: _arg(view, env, v) for k, v in node.kwargs.items()}
        env[node] = run_node(node, *args, **kwargs)
    results = {}
    for out in island.outputs:
        if view.kind(out) == Kind.QUANTIZE:
            results[out] = run_node(out, env[input_node(out)].reshape(-1), *out.args[1:], **out.kwargs)
    return results
