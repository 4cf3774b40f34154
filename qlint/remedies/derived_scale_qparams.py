"""The `derived-scale-qparams` remedy: a quantizer whose constant scales are exact identities
and whose fixed-qparams outputs (softmax) are read without a requantize.

The quantize after a constant `x / c` or `x * c` gets the qparams its input's imply, so the fold
removes the island instead of writing a 256-entry table; the consumers of a fixed-qparams output
share it instead of observing their own. Both go through the quantizer's own
`DerivedQuantizationSpec`/`SharedQuantizationSpec`, and only where no other op's qparams move.
`DerivedScaleQuantizer` is public: the line a user adds to their own export script.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

from qlint.loading import stack

stack.load()

import torch  # noqa: E402
from torch.fx import Node  # noqa: E402
from torchao.quantization.pt2e.quantizer import (  # noqa: E402
    DerivedQuantizationSpec,
    FixedQParamsQuantizationSpec,
    QuantizationSpec,
    SharedQuantizationSpec,
)

from qlint.remedies.annotating import AnnotatingQuantizer, derived_spec  # noqa: E402
from qlint.remedies.remedy import Remedy  # noqa: E402
from qlint.settings.config import RemedyName  # noqa: E402

_SCALE_OPS = {
    torch.ops.aten.div.Tensor: "div", torch.ops.aten.div.Scalar: "div",
    torch.ops.aten.mul.Tensor: "mul", torch.ops.aten.mul.Scalar: "mul",
}


@dataclass(frozen=True)
class ConstantScale:
    """`x / c` or `x * c` in the float graph, `c` a positive finite one-element constant."""

    node: Node
    input: Node
    op: str       # div | mul
    constant: float


def _one_element(graph: Any, arg: Any) -> float | None:
    if isinstance(arg, (int, float)) and not isinstance(arg, bool):
        return float(arg)
    if isinstance(arg, Node) and arg.op == "get_attr":
        value = functools.reduce(getattr, str(arg.target).split("."), graph)
        if isinstance(value, torch.Tensor) and value.numel() == 1 and value.is_floating_point():
            return float(value)
    return None


def constant_scales(graph: Any) -> list[ConstantScale]:
    found = []
    for node in graph.graph.nodes:
        op = _SCALE_OPS.get(node.target) if node.op == "call_function" else None
        if op is None or len(node.args) != 2:
            continue
        a, b = node.args
        pairs = [(a, b)] if op == "div" else [(a, b), (b, a)]
        for x, c in pairs:
            value = _one_element(graph, c)
            if isinstance(x, Node) and value is not None and math.isfinite(value) and value > 0:
                found.append(ConstantScale(node, x, op, value))
                break
    return found


def _derived_qparams(op: str, constant: float, observers: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
    scale, zero_point = observers[0].calculate_qparams()
    return (scale / constant if op == "div" else scale * constant), zero_point


def _shared_nodes(graph: Any) -> set[Node]:
    """Nodes another annotation shares or derives qparams from: changing their qspec changes another op's."""
    referred: set[Node] = set()
    for node in graph.graph.nodes:
        annotation = node.meta.get("quantization_annotation")
        if annotation is None:
            continue
        for spec in (*annotation.input_qspec_map.values(), annotation.output_qspec):
            if isinstance(spec, SharedQuantizationSpec):
                edge = spec.edge_or_node
                referred.update(edge if isinstance(edge, tuple) else (edge,))
            elif isinstance(spec, DerivedQuantizationSpec):
                for edge in spec.derived_from:
                    referred.update(edge if isinstance(edge, tuple) else (edge,))
    return referred


def _derived_spec(spec: QuantizationSpec, derived_from: Any, scale: ConstantScale) -> DerivedQuantizationSpec:
    return derived_spec(spec, [derived_from], functools.partial(_derived_qparams, scale.op, scale.constant))


def derive_scale_qparams(graph: Any) -> list[ConstantScale]:
    """Quantize each constant scale's result with the qparams its input's imply: scale S/c (or S·c), same zero point.

    Then `quantize(dequantize(q) / c)` is `q` again, an identity the fold removes.
    Where the quantizer annotated the scale, its output qspec becomes derived from
    its input edge and its one consumer shares it; where it did not (the quantize
    after it is its consumer's input), that input qspec becomes derived from the
    scale's producer. A scale with several consumers, or whose output or input
    another annotation shares or derives from, is left: no other op's qparams move.
    """
    shared = _shared_nodes(graph)
    changed = []
    for scale in constant_scales(graph):
        node, users = scale.node, list(scale.node.users)
        if node in shared or scale.input in shared or len(users) != 1:
            continue
        consumer = users[0].meta.get("quantization_annotation")
        if consumer is None or not isinstance(read := consumer.input_qspec_map.get(node), QuantizationSpec):
            continue
        annotation = node.meta.get("quantization_annotation")
        if annotation is None:
            producer = scale.input.meta.get("quantization_annotation")
            if producer is None or producer.output_qspec is None:
                continue  # no quantize before the scale: nothing to derive from
            consumer.input_qspec_map[node] = _derived_spec(read, scale.input, scale)
        elif isinstance(annotation.output_qspec, QuantizationSpec) and isinstance(
                annotation.input_qspec_map.get(scale.input), QuantizationSpec):
            annotation.output_qspec = _derived_spec(annotation.output_qspec, (scale.input, node), scale)
            consumer.input_qspec_map[node] = SharedQuantizationSpec(node)
        else:
            continue
        changed.append(scale)
    return changed


def share_fixed_qparams(graph: Any) -> list[tuple[Node, Node]]:
    """Let each consumer of a fixed-qparams output (softmax: scale 1/256) read it as it is.

    The consumer's own observer would requantize the fixed grid onto another one
    (a QL004 pair, a table after the fold) and can only lose values doing so; its
    input quantizer becomes a share of the producer's output, found through the
    reshapes that already share it. The producer's qparams are fixed, so no other
    op's change.
    """
    changed = []
    for node in graph.graph.nodes:
        annotation = node.meta.get("quantization_annotation")
        fixed = annotation.output_qspec if annotation is not None else None
        if not isinstance(fixed, FixedQParamsQuantizationSpec):
            continue
        frontier, seen = [node], set()
        while frontier:
            source = frontier.pop()
            for user in source.users:
                consumer = user.meta.get("quantization_annotation")
                spec = consumer.input_qspec_map.get(source) if consumer is not None else None
                if consumer is None or (user, source) in seen:
                    continue
                seen.add((user, source))
                if isinstance(consumer.output_qspec, SharedQuantizationSpec) and isinstance(
                        spec, (FixedQParamsQuantizationSpec, SharedQuantizationSpec)):
                    frontier.append(user)  # a reshape in the producer's group: look past it
                elif isinstance(spec, QuantizationSpec) and spec.dtype == fixed.dtype:
                    consumer.input_qspec_map[source] = SharedQuantizationSpec(source)
                    changed.append((source, user))
    return changed


class DerivedScaleQuantizer(AnnotatingQuantizer):
    """A quantizer that annotates like `inner`, then derives each constant scale's output qparams
    and lets the consumers of a fixed-qparams output read it without a requantize."""

    def reannotate(self, model: Any) -> Any:
        derive_scale_qparams(model)
        share_fixed_qparams(model)
        return model


class DerivedScaleQParams(Remedy):
    """Derive a constant `div`/`mul`'s output qparams from its input's, so the island is an exact identity,
    and share a fixed-qparams output (softmax) with its consumers, so no requantize follows it."""

    name = RemedyName.DERIVED_SCALE_QPARAMS
    user_change = (
        "from qlint.remedies.derived_scale_qparams import DerivedScaleQuantizer",
        "quantizer = DerivedScaleQuantizer(quantizer)  # the flow's (CortexMQuantizer()), before prepare_pt2e",
    )

    def not_applicable(self, graph: Any) -> str | None:
        fixed_range = {torch.ops.aten.softmax.int, torch.ops.aten._softmax.default}
        if not constant_scales(graph) and not any(n.target in fixed_range for n in graph.graph.nodes):
            return "the model has no division or multiplication by a positive one-element constant and no softmax"
        return None

    def on_quantizer(self, quantizer: Any) -> Any:
        return DerivedScaleQuantizer(quantizer)
