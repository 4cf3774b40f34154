"""Remedies at the source: export and quantization changes that let the quantizer annotate more.

A fold works on a program that is already quantized, so it cannot reach what the
quantizer never annotated: an NCHW convolution (`CortexMConv2DCheck` wants
channels_last), a fused `scaled_dot_product_attention` (no `CortexMQuantizer`
pattern). For a target qlint runs the export and the quantization itself, so it
can make the change instead of only naming it. Every remedy changes numerics,
which makes it an *unsafe* fix in ruff's sense: it runs only with
`--unsafe-fixes` or when the config lists it, and `qlint.remediate` keeps it only
when it helps and the accuracy stays within the guard.

A remedy is three optional hooks over the steps of `qlint.quantize`: the model and
its input batches before export (`on_build`, `on_inputs`), and the exported float
graph before `prepare_pt2e` (`on_graph`).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, ClassVar

from qlint import backend

backend.load()

import torch  # noqa: E402
from executorch.backends.transforms.decompose_sdpa import DecomposeScaledDotProductAttention  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

from qlint.config import RemedyName  # noqa: E402

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
        "from qlint.remedies import unfuse_attention",
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


REMEDIES: dict[RemedyName, Remedy] = {r.name: r for r in (ChannelsLast(), UnfusedAttention())}


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

