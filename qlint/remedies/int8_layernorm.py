"""The `int8-layernorm` remedy: each `layer_norm` (and `rms_norm`) over the last dimension rebuilt,
before `prepare_pt2e`, from ops that Cortex-M has int8 kernels for.

ExecuTorch's Cortex-M backend has no LayerNorm kernel and no `mean` over the last dimension,
so `native_layer_norm` stays fp32. Everything it computes has an int8 path:

    mean = linear(x, 1/C)                  cortex_m.quantized_linear (weight [1, C])
    d    = x - expand(mean)                cortex_m.quantized_add (equal shapes: the add check
    var  = linear(d * d, 1/C, bias=eps)    cortex_m.quantized_mul   refuses broadcasts)
    rstd = rsqrt(var)                      cortex_m.quantized_activation (a 256-entry table)
    y    = d * expand(rstd) * expand(w) + expand(b)

An `rms_norm` is the same without the mean (`d = x`, eps `finfo.eps` when not given). A
normalization written out by hand is rebuilt the same way (`written_norm`): Llama-style RMSNorm,
`h * rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)`, and LayerNorm written with `mean`, `(x - u) /
sqrt((x - u).pow(2).mean(-1, keepdim=True) + eps)` (`rsqrt`/`sqrt`, `pow(2)`/`d * d`); the
user's own weight and bias after it stay as they are. The rewrite is float-equal to the
normalization up to float rounding; the quantized program is not, which is why this is an unsafe
fix measured like the others. `rebuild_layer_norms` is public: the line a user adds to their own
export script.

The statistics are one value a row (mean, variance, rsqrt), and calibration sees few rows: a
transformer's two calibration batches of 8 tokens give 16. Rows it never saw fall outside the ranges
their observers chose, and a clipped variance scales a whole row wrong. When the plain rebuild is
over the guard, the search tries it with `NormRangesQuantizer` (`Int8LayerNorm(ranged=True)`):
the statistics get twice the range calibration saw, the centred values the range their operands'
ranges allow, and the norm's other intermediates their observed min and max instead of a histogram's
narrower choice. The bounds that always hold (a mean within the input's range, a variance at most
(max - min)^2 / 4) cost too many int8 steps: measured on `nn.TransformerEncoder`, 3.4 dB.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from qlint.loading import stack

stack.load()

import torch  # noqa: E402
from torch.fx import GraphModule, Node  # noqa: E402
from torchao.quantization.pt2e.observer import MinMaxObserver  # noqa: E402
from torchao.quantization.pt2e.quantizer import (  # noqa: E402
    DerivedQuantizationSpec,
    QuantizationSpec,
    SharedQuantizationSpec,
)

from qlint.remedies.annotating import AnnotatingQuantizer, derived_spec  # noqa: E402
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
    """Rebuild every `layer_norm` and `rms_norm` over the last dimension, called or written out, from
    linear, add, mul and an rsqrt table."""

    name = RemedyName.INT8_LAYERNORM
    public = "rebuild_layer_norms"
    none_found = "the exported model has no layer_norm or rms_norm, called or written out"

    def nodes(self, graph: Any) -> list[Any]:
        return norm_nodes(graph)

    def why_not(self, graph: Any, node: Any) -> str | None:
        return not_rebuildable(node)

    def __init__(self, skip: frozenset[str] = frozenset(), ranged: bool = False) -> None:
        super().__init__(skip)
        self.ranged = ranged  # quantized with NormRangesQuantizer

    def leaving(self, sites: frozenset[str]) -> Int8LayerNorm:
        return Int8LayerNorm(skip=self.skip | sites, ranged=self.ranged)

    def alternative(self) -> Int8LayerNorm | None:
        return None if self.ranged else Int8LayerNorm(skip=self.skip, ranged=True)

    def variant(self) -> str:
        return ("with the statistics ranged for rows calibration did not see (NormRangesQuantizer)"
                if self.ranged else "")

    def user_lines(self) -> tuple[str, ...]:
        lines = super().user_lines()
        if not self.ranged:
            return lines
        return (f"{lines[0]}, NormRangesQuantizer", lines[1],
                "quantizer = NormRangesQuantizer(quantizer)  # the flow's (CortexMQuantizer()), before prepare_pt2e")

    def on_graph(self, graph: Any) -> Any:
        return rebuild_layer_norms(graph, skip_unsupported=True, skip=self.skip)

    def on_quantizer(self, quantizer: Any) -> Any:
        return NormRangesQuantizer(quantizer) if self.ranged else quantizer


@dataclass(frozen=True)
class Norm:
    """A normalization over the last dimension: its input, what it normalizes over, its affine
    operands (a written one has none: the user's own ops after it stay) and eps."""

    centred: bool            # layer_norm (the mean is taken off) or rms_norm
    x: Any
    shape: list[int]
    weight: Node | None
    bias: Node | None
    eps: float
    pattern: tuple[Node, ...] = ()   # a written one's ops, last first, which the rebuild replaces


def norm_nodes(graph: Any) -> list[Node]:
    """The graph's `layer_norm` and `rms_norm` calls and written-out normalizations (by their last
    op), in graph order."""
    return [n for n in graph.graph.nodes
            if n.op == "call_function" and (n.target in _ARGUMENTS or written_norm(n) is not None)]


def _is(node: Any, *targets: Any) -> bool:
    """A call of one of `targets` with no `alpha` other than 1 (`sub(x, u, alpha=2)` is not `x - u`)."""
    return isinstance(node, Node) and node.op == "call_function" and node.target in targets \
        and node.kwargs.get("alpha", 1) == 1


def _only_used_in(node: Node, users: Collection[Node]) -> bool:
    return all(user in users for user in node.users)


def _mean_of_last(node: Any) -> Node | None:
    """The input of `x.mean(-1, keepdim=True)`."""
    if not _is(node, _aten.mean.dim) or not isinstance(node.args[0], Node):
        return None
    x, dims = node.args[0], node.args[1] if len(node.args) > 1 else None
    keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    if not isinstance(dims, (list, tuple)):
        return None  # a mean over every dimension
    value = x.meta.get("val")
    rank = value.dim() if isinstance(value, torch.Tensor) else 0
    return x if keepdim and list(dims) in ([-1], [rank - 1]) and rank > 0 else None


def _square_of(node: Any) -> Node | None:
    """The input of `d.pow(2)` or `d * d`."""
    if _is(node, _aten.pow.Tensor_Scalar) and node.args[1] == 2 and isinstance(node.args[0], Node):
        return node.args[0]
    if _is(node, _aten.mul.Tensor) and node.args[0] is node.args[1] and isinstance(node.args[0], Node):
        return node.args[0]
    return None


def _same_value(a: Node, b: Node) -> bool:
    """The same node, or the same op on the same operands (`x - u` written twice, which export keeps)."""
    return a is b or (_is(a, a.target) and _is(b, a.target) and a.args == b.args and a.kwargs == b.kwargs)


def _scaled_by_inverse_root(node: Any) -> tuple[Node, Node, Node] | None:
    """(d, s, the root op) of `d * rsqrt(s)`, `rsqrt(s) * d` or `d / sqrt(s)`."""
    if _is(node, _aten.mul.Tensor):
        for d, root in (node.args[:2], reversed(node.args[:2])):
            if _is(root, _aten.rsqrt.default) and isinstance(d, Node):
                return d, root.args[0], root
    if _is(node, _aten.div.Tensor) and _is(node.args[1], _aten.sqrt.default) and isinstance(node.args[0], Node):
        return node.args[0], node.args[1].args[0], node.args[1]
    return None


def written_norm(node: Any) -> Norm | None:
    """The normalization `node` ends, when it is one written out by hand over the last dimension."""
    found = _scaled_by_inverse_root(node)
    if found is None:
        return None
    d, s, root = found
    if not _is(s, _aten.add.Tensor) or not isinstance(s.args[1], (int, float)):
        return None
    variance, eps = s.args[0], float(s.args[1])
    squared = _mean_of_last(variance)
    twin = _square_of(squared)
    if twin is None or not _same_value(twin, d) or not isinstance(variance, Node) or not isinstance(squared, Node):
        return None
    pattern: tuple[Node, ...] = (node, root, s, variance, squared)
    x: Node = d
    mean = d.args[1] if _is(d, _aten.sub.Tensor) else None
    centred = isinstance(mean, Node) and _mean_of_last(mean) is d.args[0]
    if centred and isinstance(mean, Node) and isinstance(d.args[0], Node):
        x = d.args[0]
        pattern = (*pattern, *dict.fromkeys((d, twin)), mean)  # `x - u` may be written twice
    inside = set(pattern)
    if not all(_only_used_in(n, inside) for n in pattern[1:]):
        return None  # an intermediate the model reads elsewhere: it must stay
    shape = [int(x.meta["val"].shape[-1])] if isinstance(x.meta.get("val"), torch.Tensor) else []
    return Norm(centred, x, shape, None, None, eps, pattern)


def _norm(node: Node) -> Norm:
    """A `layer_norm`/`rms_norm` call's or a written normalization's arguments."""
    written = written_norm(node)
    if written is not None:
        return written
    names = _ARGUMENTS[node.target]
    values = {**dict(names), **dict(zip((name for name, _ in names), node.args, strict=False)), **node.kwargs}
    x = values["input"]
    eps = values["eps"]
    if eps is None:
        eps = torch.finfo(x.meta["val"].dtype).eps if isinstance(x, Node) and "val" in x.meta else 0.0
    return Norm(node.target == _LAYER_NORM, x, list(values["normalized_shape"]), values["weight"],
                values.get("bias"), float(eps))


def not_rebuildable(node: Node) -> str | None:
    """Why this normalization cannot be rebuilt from int8 kernels, or None when it can."""
    norm = _norm(node)
    value = norm.x.meta.get("val") if isinstance(norm.x, Node) else None
    if not isinstance(value, torch.Tensor) or not value.is_floating_point():
        return f"{node.name}: its input has no float value recorded"
    if len(norm.shape) != 1:
        return f"{node.name}: it normalizes over {len(norm.shape)} dimensions {norm.shape}, not the last one alone"
    if norm.eps <= 0.0:
        return f"{node.name}: eps={norm.eps!r} makes rsqrt(variance) infinite for a constant row"
    for operand in (norm.weight, norm.bias):
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
    norm = _norm(node)
    x, value = norm.x, norm.x.meta["val"]
    channels, full = norm.shape[0], list(value.shape)
    averaging = torch.full((1, channels), 1.0 / channels, dtype=value.dtype)
    if norm.centred:
        graph.register_buffer(f"{prefix}_mean", averaging.clone())
    graph.register_buffer(f"{prefix}_variance", averaging.clone())
    graph.register_buffer(f"{prefix}_eps", torch.tensor([norm.eps], dtype=value.dtype))

    def add(target: Any, *args: Any, role: str | None = None) -> Node:
        created: Node = node_for(graph, node, target, args)
        if role is not None:
            created.meta[ROLE] = role
        return created

    with graph.graph.inserting_before(node):
        centred = x  # rms_norm: no mean
        if norm.centred:
            mean = add(_aten.linear.default, x, add("get_attr", f"{prefix}_mean"), role=MEAN)
            centred = add(_aten.sub.Tensor, x, add(_aten.expand.default, mean, full), role=CENTRED)
        variance = add(_aten.linear.default, add(_aten.mul.Tensor, centred, centred, role=INTERMEDIATE),
                       add("get_attr", f"{prefix}_variance"), add("get_attr", f"{prefix}_eps"), role=VARIANCE)
        rstd = add(_aten.rsqrt.default, variance, role=RSTD)
        result = add(_aten.mul.Tensor, centred, add(_aten.expand.default, rstd, full), role=INTERMEDIATE)
        affine: list[tuple[Callable[..., Any], Node | None]] = [(_aten.mul.Tensor, norm.weight),
                                                                (_aten.add.Tensor, norm.bias)]
        for op, operand in affine:
            if operand is not None:
                result = add(op, result, add(_aten.expand.default, operand, full), role=INTERMEDIATE)
    result.meta.pop(ROLE, None)  # the norm's output: quantized as the quantizer chose, as the float norm's was
    node.replace_all_uses_with(result)
    for gone in norm.pattern or (node,):  # last op first: each has no user left when it is erased
        if not gone.users:
            graph.graph.erase_node(gone)


# What each op of a rebuilt norm computes, on its node's meta: NormRangesQuantizer ranges it by this
ROLE = "qlint_norm_role"
MEAN, VARIANCE, RSTD = "mean", "variance", "rstd"   # one value a row: the statistics
CENTRED = "centred"                                  # x - mean
INTERMEDIATE = "intermediate"                        # d * d, d * rstd, and * w before + b
STATISTICS = frozenset({MEAN, VARIANCE, RSTD})
# The statistics' ranges, as a multiple of calibration's. Twice covers the rows of the SQNR batches
# on the transformers zoo's BERT, whose calibration's 16 rows leave 7-19 of 48 per-row statistics
# clipped; it costs one int8 step in two.
STATISTICS_RANGE = 2.0


class _WidenedMinMaxObserver(MinMaxObserver):
    """Min and max observed, the qparams for STATISTICS_RANGE times them (a range that holds 0)."""

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._calculate_qparams(self.min_val * STATISTICS_RANGE, self.max_val * STATISTICS_RANGE)


def _centred_qparams(observers: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """`x - mean`'s qparams from what its operands' observers saw: [x_min - mean_max, x_max - mean_min]."""
    x, mean = observers
    low = torch.clamp(x.min_val - mean.max_val, max=0.0)
    high = torch.clamp(x.max_val - mean.min_val, min=0.0)
    return x._calculate_qparams(low, high)


def _ranged(node: Node, spec: QuantizationSpec) -> QuantizationSpec | DerivedQuantizationSpec:
    role = node.meta[ROLE]
    if role == CENTRED:
        x, mean = node.args[0], node.args[1]
        return derived_spec(spec, [(x, node), (mean, node)], _centred_qparams)
    return dataclasses.replace(spec, observer_or_fake_quant_ctr=(
        _WidenedMinMaxObserver if role in STATISTICS else MinMaxObserver))


def range_norms(model: GraphModule) -> GraphModule:
    """Each rebuilt norm's intermediates ranged by their role; their consumers read them as they are."""
    for node in model.graph.nodes:
        annotation = node.meta.get("quantization_annotation")
        if ROLE not in node.meta or annotation is None or not isinstance(annotation.output_qspec, QuantizationSpec):
            continue
        annotation.output_qspec = _ranged(node, annotation.output_qspec)
        for user in node.users:
            read = user.meta.get("quantization_annotation")
            if read is not None and isinstance(read.input_qspec_map.get(node), QuantizationSpec):
                read.input_qspec_map[node] = SharedQuantizationSpec(node)
    return model


class NormRangesQuantizer(AnnotatingQuantizer):
    """A quantizer that annotates like `inner`, then ranges each norm `rebuild_layer_norms` rebuilt
    for rows calibration did not see (see the module's docstring)."""

    def reannotate(self, model: GraphModule) -> GraphModule:
        return range_norms(model)
