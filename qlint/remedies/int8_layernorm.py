"""The `int8-layernorm` remedy: each `layer_norm` (and `rms_norm`) over the last dimension rebuilt,
before `prepare_pt2e`, from ops that Cortex-M has int8 kernels for.

ExecuTorch's Cortex-M backend has no LayerNorm kernel and no `mean` over the last dimension,
so `native_layer_norm` stays fp32. Everything it computes has an int8 path:

    mean = linear(x, 1/C)                  cortex_m.quantized_linear (weight [1, C])
    d    = x - expand(mean)                cortex_m.quantized_add (equal shapes: the add check
    var  = linear(d * d, 1/C, bias=eps)    cortex_m.quantized_mul   refuses broadcasts)
    rstd = rsqrt(var)                      cortex_m.quantized_activation (a 256-entry table)
    y    = d * expand(rstd) * expand(w) + expand(b)

An `rms_norm` is the same without the mean (`d = x`, eps `finfo.eps` when not given). The
rewrite is float-equal to `layer_norm` up to float rounding; the quantized program is
not, which is why this is an unsafe fix measured like the others. `rebuild_layer_norms` is
public: the line a user adds to their own export script.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from qlint.graph import stack

stack.load()

import torch  # noqa: E402
from torch.fx import GraphModule, Node  # noqa: E402

from qlint.remedies.remedy import SitedRemedy, node_for, rewrite_each  # noqa: E402
from qlint.settings.config import RemedyName  # noqa: E402

_aten = torch.ops.aten
_LAYER_NORM = _aten.layer_norm.default
_RMS_NORM = _aten.rms_norm.default
# each op's arguments in order, with their defaults (eps None: the dtype's machine epsilon, as rms_norm does)
_ARGUMENTS: dict[Any, tuple[tuple[str, Any], ...]] = {
    _LAYER_NORM: (("input", None), ("normalized_shape", None), ("weight", None), ("bias", None), ("eps", 1e-5)),
    _RMS_NORM: (("input", None), ("normalized_shape", None), ("weight", None), ("eps", None)),
}


class Int8LayerNorm(SitedRemedy):
    """Rebuild every `layer_norm` and `rms_norm` over the last dimension from linear, add, mul and an rsqrt table."""

    name = RemedyName.INT8_LAYERNORM
    public = "rebuild_layer_norms"
    none_found = "the exported model has no layer_norm or rms_norm"

    def nodes(self, graph: Any) -> list[Any]:
        return norm_nodes(graph)

    def why_not(self, graph: Any, node: Any) -> str | None:
        return not_rebuildable(node)

    def on_graph(self, graph: Any) -> Any:
        return rebuild_layer_norms(graph, skip_unsupported=True, skip=self.skip)


def norm_nodes(graph: Any) -> list[Node]:
    """The graph's `layer_norm` and `rms_norm` calls, in graph order."""
    return [n for n in graph.graph.nodes if n.op == "call_function" and n.target in _ARGUMENTS]


def _norm_args(node: Node) -> tuple[Node, list[int], Node | None, Node | None, float]:
    """input, normalized_shape, weight, bias (None for rms_norm) and eps of a `layer_norm`/`rms_norm` call."""
    names = _ARGUMENTS[node.target]
    values = {**dict(names), **dict(zip((name for name, _ in names), node.args, strict=False)), **node.kwargs}
    x = values["input"]
    eps = values["eps"]
    if eps is None:
        eps = torch.finfo(x.meta["val"].dtype).eps if isinstance(x, Node) and "val" in x.meta else 0.0
    return x, list(values["normalized_shape"]), values["weight"], values.get("bias"), float(eps)


def not_rebuildable(node: Node) -> str | None:
    """Why this `layer_norm` or `rms_norm` cannot be rebuilt from int8 kernels, or None when it can."""
    x, shape, weight, bias, eps = _norm_args(node)
    value = x.meta.get("val")
    if not isinstance(value, torch.Tensor) or not value.is_floating_point():
        return f"{node.name}: its input has no float value recorded"
    if len(shape) != 1:
        return f"{node.name}: it normalizes over {len(shape)} dimensions {shape}, not the last one alone"
    if eps <= 0.0:
        return f"{node.name}: eps={eps!r} makes rsqrt(variance) infinite for a constant row"
    for operand in (weight, bias):
        if operand is not None and not isinstance(operand, Node):
            return f"{node.name}: its affine operand {operand!r} is not a tensor"
    return None


def rebuild_layer_norms(
    graph: GraphModule, *, skip_unsupported: bool = False, skip: Collection[str] = ()
) -> GraphModule:
    """The graph module with each `layer_norm` and `rms_norm` over its last dimension rebuilt from int8-kernel ops.

    For an export script: call it on `torch.export.export(...).module()` before `prepare_pt2e`.
    Raises ValueError naming one that cannot be rebuilt, unless `skip_unsupported`, which leaves
    that one as it is. `skip` names (by module path, `site_name`) the ones to leave in float.
    """
    return rewrite_each(graph, norm_nodes(graph), not_rebuildable,
                        lambda node, index: _rebuild(graph, node, f"_qlint_layer_norm_{index}"),
                        skip_unsupported=skip_unsupported, skip=skip, verb="rebuild")


def _rebuild(graph: GraphModule, node: Node, prefix: str) -> None:
    x, shape, weight, bias, eps = _norm_args(node)
    value = x.meta["val"]
    channels, full = shape[0], list(value.shape)
    averaging = torch.full((1, channels), 1.0 / channels, dtype=value.dtype)
    if node.target == _LAYER_NORM:
        graph.register_buffer(f"{prefix}_mean", averaging.clone())
    graph.register_buffer(f"{prefix}_variance", averaging.clone())
    graph.register_buffer(f"{prefix}_eps", torch.tensor([eps], dtype=value.dtype))

    def add(target: Any, *args: Any) -> Node:
        return node_for(graph, node, target, args)

    with graph.graph.inserting_before(node):
        centred = x  # rms_norm: no mean
        if node.target == _LAYER_NORM:
            mean = add(_aten.linear.default, x, add("get_attr", f"{prefix}_mean"))
            centred = add(_aten.sub.Tensor, x, add(_aten.expand.default, mean, full))
        variance = add(_aten.linear.default, add(_aten.mul.Tensor, centred, centred),
                       add("get_attr", f"{prefix}_variance"), add("get_attr", f"{prefix}_eps"))
        rstd = add(_aten.rsqrt.default, variance)
        result = add(_aten.mul.Tensor, centred, add(_aten.expand.default, rstd, full))
        affine: list[tuple[Callable[..., Any], Node | None]] = [(_aten.mul.Tensor, weight), (_aten.add.Tensor, bias)]
        for op, operand in affine:
            if operand is not None:
                result = add(op, result, add(_aten.expand.default, operand, full))
    node.replace_all_uses_with(result)
    graph.graph.erase_node(node)
