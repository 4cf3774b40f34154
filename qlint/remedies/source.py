"""Remedies at the source: export and quantization changes that let the quantizer annotate more.

A fold works on a program that is already quantized, so it cannot reach what the
quantizer never annotated: an NCHW convolution (`CortexMConv2DCheck` wants
channels_last), a fused `scaled_dot_product_attention` (no `CortexMQuantizer`
pattern). For a target qlint runs the export and the quantization itself, so it
can make the change instead of only naming it. Every remedy changes numerics,
which makes it an *unsafe* fix in ruff's sense: it runs only with
`--unsafe-fixes` or when the config lists it, and `qlint.remedies.search` keeps it only
when it helps and the accuracy stays within the guard.

A remedy is optional hooks over the steps of `qlint.graph.quantize`: the model and its
input batches before export (`on_build`, `on_inputs`), the exported float graph
before `prepare_pt2e` (`on_graph`), and the quantizer (`on_quantizer`).
"""

from __future__ import annotations

import copy
import functools
import math
from dataclasses import dataclass
from typing import Any, ClassVar

from qlint.graph import stack

stack.load()

import torch  # noqa: E402
from executorch.backends.transforms.decompose_sdpa import DecomposeScaledDotProductAttention  # noqa: E402
from torch.fx import Node  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402
from torchao.quantization.pt2e.quantizer import (  # noqa: E402
    DerivedQuantizationSpec,
    FixedQParamsQuantizationSpec,
    QuantizationSpec,
    Quantizer,
    SharedQuantizationSpec,
)

from qlint.rules.records import IOQParams, ProgramIO  # noqa: E402
from qlint.settings.config import RemedyName  # noqa: E402

_SDPA = torch.ops.aten.scaled_dot_product_attention.default


@dataclass(frozen=True)
class Build:
    """What a target is exported from: the model, its example inputs and its calibration batches."""

    model: Any
    example: tuple[Any, ...]
    calibration: tuple[tuple[Any, ...], ...]


class Remedy:
    """One change to how a target is built; the defaults change nothing."""

    name: ClassVar[RemedyName]
    user_change: ClassVar[tuple[str, ...]]  # the lines a user adds to their own export script

    def not_applicable(self, graph: Any) -> str | None:
        """Why this remedy cannot change the exported float `graph`, or None when it can."""
        raise NotImplementedError

    def on_inputs(self, batch: tuple[Any, ...]) -> tuple[Any, ...]:
        return batch

    def on_build(self, build: Build) -> Build:
        return build

    def on_graph(self, graph: Any) -> Any:
        return graph

    def on_quantizer(self, quantizer: Any) -> Any:
        return quantizer

    def on_program(self, program: Any) -> ProgramIO | None:
        """Change the quantized ExportedProgram in place; say how its inputs and outputs changed."""
        return None


def _call_nodes(graph: Any, target: Any) -> list[Any]:
    return [n for n in graph.graph.nodes if n.op == "call_function" and n.target == target]


class ChannelsLast(Remedy):
    """Export the module and its 4-D inputs in channels_last, the layout CortexMConv2DCheck accepts."""

    name = RemedyName.CHANNELS_LAST
    user_change = (
        "model = model.to(memory_format=torch.channels_last)",
        "example_inputs = tuple(x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x "
        "for x in example_inputs)  # and every calibration batch; the application feeds NHWC data",
    )

    def not_applicable(self, graph: Any) -> str | None:
        convs = _call_nodes(graph, torch.ops.aten.conv2d.default)
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


class UnfusedAttention(Remedy):
    """Replace every `scaled_dot_product_attention` by `softmax(q @ kᵀ · scale + mask) @ v` before prepare_pt2e.

    ExecuTorch's own `DecomposeScaledDotProductAttention` keeps SDPA's math
    decomposition, which scales q and k by √scale each and ends in `_safe_softmax`
    (softmax, `full_like`, `where`): the two scales become table folds and no
    softmax pattern matches. The explicit form gives two `bmm`, one constant scale
    and a `_softmax`, each with a Cortex-M pattern.
    """

    name = RemedyName.UNFUSED_ATTENTION
    user_change = (
        "from qlint.remedies.source import unfuse_attention",
        "graph = unfuse_attention(torch.export.export(model, example_inputs).module())  # before prepare_pt2e",
    )

    def not_applicable(self, graph: Any) -> str | None:
        calls = _call_nodes(graph, _SDPA)
        if not calls:
            return "the exported model has no scaled_dot_product_attention"
        for node in calls:
            reason = _unsupported_sdpa(node)
            if reason:
                return f"{node.name}: {reason}"
        return None

    def on_graph(self, graph: Any) -> Any:
        return unfuse_attention(graph)


def _unsupported_sdpa(node: Any) -> str | None:
    args, _, enable_gqa = DecomposeScaledDotProductAttention._canonicalize_sdpa_call(node)
    if args[4] not in (0, 0.0):
        return f"dropout_p={args[4]!r} (export the model in eval mode)"
    if enable_gqa:
        return "grouped-query attention (enable_gqa=True)"
    return None


class _ExplicitAttention(DecomposeScaledDotProductAttention):
    """ExecuTorch's SDPA decomposition pass, tracing the explicit form in place of SDPA's math kernel."""

    def _decompose_sdpa_node(self, graph_module: Any, node: Any, allow_non_fake_inputs: bool) -> None:
        inputs, scale, _ = self._canonicalize_sdpa_call(node)
        values = tuple(self._extract_arg_value(a) for a in inputs)
        traced = make_fx(
            _explicit_attention(bool(values[5]), scale), tracing_mode="fake",
            _allow_non_fake_inputs=allow_non_fake_inputs,
        )(*values)
        with graph_module.graph.inserting_before(node):
            # scale=None: the explicit form already carries it (the base class would split it in two)
            self._copy_decomposed_graph(graph_module.graph, node, traced, inputs, None)
            graph_module.graph.erase_node(node)


def _explicit_attention(is_causal: bool, scale: float | None) -> Any:
    def explicit(q: Any, k: Any, v: Any, attn_mask: Any = None, *_: Any) -> Any:
        scores = (q @ k.transpose(-2, -1)) * (scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]))
        if is_causal:
            keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
            scores = scores.masked_fill(~keep, float("-inf"))
        if attn_mask is not None:
            scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else (
                scores + attn_mask)
        return torch.softmax(scores, dim=-1) @ v

    return explicit


def unfuse_attention(graph: Any) -> Any:
    """The graph module with each `scaled_dot_product_attention` in its explicit, quantizable form.

    For an export script: call it on `torch.export.export(...).module()` before `prepare_pt2e`.
    """
    for node in _call_nodes(graph, _SDPA):
        reason = _unsupported_sdpa(node)
        if reason:
            raise ValueError(f"cannot unfuse {node.name}: {reason}")
    result = _ExplicitAttention()(graph)
    assert result is not None
    return result.graph_module


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
    bounds = torch.iinfo(spec.dtype)
    return DerivedQuantizationSpec(
        derived_from=[derived_from],
        derive_qparams_fn=functools.partial(_derived_qparams, scale.op, scale.constant),
        dtype=spec.dtype,
        quant_min=spec.quant_min if spec.quant_min is not None else bounds.min,
        quant_max=spec.quant_max if spec.quant_max is not None else bounds.max,
        qscheme=spec.qscheme,
    )


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


class DerivedScaleQuantizer(Quantizer):
    """A quantizer that annotates like `inner`, then derives each constant scale's output qparams
    and lets the consumers of a fixed-qparams output read it without a requantize."""

    def __init__(self, inner: Quantizer) -> None:
        super().__init__()
        self.inner = inner

    def transform_for_annotation(self, model: Any) -> Any:
        return self.inner.transform_for_annotation(model)

    def annotate(self, model: Any) -> Any:
        model = self.inner.annotate(model)
        derive_scale_qparams(model)
        share_fixed_qparams(model)
        return model

    def validate(self, model: Any) -> None:
        self.inner.validate(model)


class DerivedScaleQParams(Remedy):
    """Derive a constant `div`/`mul`'s output qparams from its input's, so the island is an exact identity,
    and share a fixed-qparams output (softmax) with its consumers, so no requantize follows it."""

    name = RemedyName.DERIVED_SCALE_QPARAMS
    user_change = (
        "from qlint.remedies.source import DerivedScaleQuantizer",
        "prepared = prepare_pt2e(graph, DerivedScaleQuantizer(CortexMQuantizer()))",
    )

    def not_applicable(self, graph: Any) -> str | None:
        fixed_range = {torch.ops.aten.softmax.int, torch.ops.aten._softmax.default}
        if not constant_scales(graph) and not any(n.target in fixed_range for n in graph.graph.nodes):
            return "the model has no division or multiplication by a positive one-element constant and no softmax"
        return None

    def on_quantizer(self, quantizer: Any) -> Any:
        return DerivedScaleQuantizer(quantizer)


class Int8IO(Remedy):
    """The program takes int8 inputs and returns int8 outputs: ExecuTorch's quantized-IO passes.

    An MCU application usually has integer data already; the fp32 inputs (and the
    quantize that converts them) are what holds SAM's arena at its live peak.
    """

    name = RemedyName.INT8_IO
    user_change = (
        "from executorch.exir.passes.quantize_io_pass import quantize_input, quantize_output",
        "for i in range(len(exported.graph_signature.user_inputs)): quantize_input(exported, i)  # before to_edge",
        "for i in range(len(exported.graph_signature.user_outputs)): quantize_output(exported, i)",
    )

    def not_applicable(self, graph: Any) -> str | None:
        return None  # known only once quantized: `on_program` says which inputs and outputs qualify

    def on_program(self, program: Any) -> ProgramIO:
        from executorch.exir.passes.quantize_io_pass import quantize_input, quantize_output
        from torch.export.graph_signature import TensorArgument

        quant = torch.ops.quantized_decomposed
        signature = program.graph_signature
        inputs = []
        for index, name in enumerate(signature.user_inputs):
            placeholder = next(n for n in program.graph.nodes if n.op == "placeholder" and n.name == name)
            users = list(placeholder.users)
            if len(users) == 1 and users[0].target == quant.quantize_per_tensor.default:
                inputs.append(_io_qparams(name, index, quantize_input(program, index)))
        outputs = []
        output_node = program.graph.output_node()
        specs = [s for s in signature.output_specs if s.kind.name == "USER_OUTPUT"]
        for index, value in enumerate(output_node.args[0]):
            if isinstance(value, Node) and value.target == quant.dequantize_per_tensor.default:
                outputs.append(_io_qparams(value.name, index, quantize_output(program, index)))
                specs[index].arg = TensorArgument(name=output_node.args[0][index].name)  # keep the signature true
        return ProgramIO(tuple(inputs), tuple(outputs))


def _io_qparams(name: str, index: int, args: tuple[Any, ...]) -> IOQParams:
    scale, zero_point, qmin, qmax, dtype = args
    return IOQParams(name, index, float(scale), int(zero_point), int(qmin), int(qmax),
                     str(dtype).removeprefix("torch."))


def feed(batch: tuple[Any, ...], io: ProgramIO | None) -> tuple[Any, ...]:
    """A float batch as the program takes it: the inputs `io` made integer, quantized with their qparams."""
    by_index = {q.index: q for q in io.inputs} if io is not None else {}
    return tuple(
        torch.ops.quantized_decomposed.quantize_per_tensor.default(
            t, q.scale, q.zero_point, q.qmin, q.qmax, getattr(torch, q.dtype))
        if (q := by_index.get(index)) is not None else t
        for index, t in enumerate(batch)
    )


def read(outputs: list[Any], io: ProgramIO | None) -> list[Any]:
    """The program's outputs as floats: the ones `io` made integer, dequantized with their qparams."""
    by_index = {q.index: q for q in io.outputs} if io is not None else {}
    return [
        torch.ops.quantized_decomposed.dequantize_per_tensor.default(
            t, q.scale, q.zero_point, q.qmin, q.qmax, t.dtype)
        if (q := by_index.get(index)) is not None else t
        for index, t in enumerate(outputs)
    ]


REMEDIES: dict[RemedyName, Remedy] = {
    r.name: r for r in (ChannelsLast(), UnfusedAttention(), DerivedScaleQParams(), Int8IO())
}


def apply_to_build(build: Build, remedies: list[Remedy]) -> Build:
    for remedy in remedies:
        build = remedy.on_build(build)
    return build


def apply_to_inputs(batch: tuple[Any, ...], remedies: list[Remedy]) -> tuple[Any, ...]:
    for remedy in remedies:
        batch = remedy.on_inputs(batch)
    return batch


def apply_to_graph(graph: Any, remedies: list[Remedy]) -> Any:
    for remedy in remedies:
        graph = remedy.on_graph(graph)
    return graph


def apply_to_quantizer(quantizer: Any, remedies: list[Remedy]) -> Any:
    for remedy in remedies:
        quantizer = remedy.on_quantizer(quantizer)
    return quantizer


def apply_to_program(program: Any, remedies: list[Remedy]) -> ProgramIO | None:
    io = None
    for remedy in remedies:
        io = remedy.on_program(program) or io
    return io

