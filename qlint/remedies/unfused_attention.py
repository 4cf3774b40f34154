"""The `unfused-attention` remedy: each `scaled_dot_product_attention` in its explicit form,
`softmax(q @ kᵀ · scale + mask) @ v`, before `prepare_pt2e`.

A fused SDPA matches no `CortexMQuantizer` pattern, so it stays fp32; the explicit form is two
`bmm`, one constant scale and a `_softmax`, each with a Cortex-M pattern. `unfuse_attention` is
public: the line a user adds to their own export script.
"""

from __future__ import annotations

import math
from typing import Any

from qlint.loading import stack

stack.load()

import torch  # noqa: E402
from executorch.backends.transforms.decompose_sdpa import DecomposeScaledDotProductAttention  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

from qlint.remedies.remedy import Remedy, call_nodes  # noqa: E402
from qlint.settings.config import RemedyName  # noqa: E402

_SDPA = torch.ops.aten.scaled_dot_product_attention.default


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
        "from qlint.remedies.unfused_attention import unfuse_attention",
        "graph = unfuse_attention(torch.export.export(model, example_inputs).module())  # before prepare_pt2e",
    )

    def not_applicable(self, graph: Any) -> str | None:
        calls = call_nodes(graph, _SDPA)
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
    for node in call_nodes(graph, _SDPA):
        reason = _unsupported_sdpa(node)
        if reason:
            raise ValueError(f"cannot unfuse {node.name}: {reason}")
    result = _ExplicitAttention()(graph)
    assert result is not None
    return result.graph_module
