"""Why an op stayed fp32, decided with ExecuTorch's own CortexMQuantizer pattern checkers.

"The backend does not lower aten.convolution" sends a user the wrong way when
the backend lowers every channels_last conv2d and the quantizer only refused
this one's memory format. So for an fp32 op qlint looks up the quantizer
patterns that start with it (`CORTEX_M_QUANTIZER_SUPPORT_DICT`) and runs their
own checkers on the node's recorded tensor metadata: no pattern, a pattern that
refused it (and the export change that satisfies the checker), or a pattern
that accepts it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch.fx import Node

from qlint.graph_view import base_name, op_name, output_value

CHANNELS_LAST = ("export with model.to(memory_format=torch.channels_last) and channels_last example inputs "
                 "(for a config target: the channels-last remedy, qlint fix --unsafe-fixes)")
# What each checker requires, in words, and the change in the export code that meets it.
_CHECKERS = {
    "CortexMConv2DCheck": ("channels_last tensors", CHANNELS_LAST),
    "CortexMConvTranspose2DCheck": ("channels_last tensors", CHANNELS_LAST),
    "CortexMAvgPool2DCheck": ("channels_last tensors", CHANNELS_LAST),
    "CortexMMaxPool2DCheck": ("channels_last tensors", CHANNELS_LAST),
    "CortexMSoftmaxCheck": (
        "a softmax over the last dimension of a contiguous tensor, or over the channels of a tensor whose "
        "strides read as channels_last (as any [N, C, 1, 1] tensor's do)",
        "",
    ),
    "CortexMAddMulCheck": (
        "operands of one shape, or a per-channel broadcast on channels_last tensors",
        "expand the smaller operand to the other's shape (a per-channel [N, C, 1, 1] operand may "
        "instead stay as it is with a channels_last export)",
    ),
}


@dataclass(frozen=True)
class Cause:
    """What is true about some fp32 ops, and what the user changes to make them int8."""

    ops: tuple[str, ...]
    why: str
    remedy: str = ""

    def __str__(self) -> str:
        text = f"{', '.join(self.ops)}: {self.why}"
        return f"{text}; {self.remedy}" if self.remedy else text


def _pattern_op(node: Node) -> str:
    """The aten op the quantizer's patterns name for this (possibly decomposed) node."""
    base = base_name(op_name(node)).lstrip("_")
    if base == "convolution":
        value = output_value(node.args[0]) if isinstance(node.args[0], Node) else None
        rank = getattr(value, "ndim", 4)
        transposed = len(node.args) > 6 and bool(node.args[6])
        return f"conv{'_transpose' if transposed else ''}{rank - 2}d"
    return {"addmm": "linear", "mm": "linear"}.get(base, base)


def _names(support: Any) -> list[tuple[tuple[str, ...], Any]]:
    return [(tuple(op._opname.lstrip("_") for op in pattern), checker) for pattern, checker in support.items()]


@functools.cache
def _patterns() -> list[tuple[tuple[str, ...], Any]]:
    """(the ops of the pattern, its checker) for every CortexMQuantizer pattern; read once."""
    from executorch.backends.cortex_m.quantizer.quantizer_support import CORTEX_M_QUANTIZER_SUPPORT_DICT

    return _names(CORTEX_M_QUANTIZER_SUPPORT_DICT)


@functools.cache
def _explicit_layout_covers(wanted: str) -> bool:
    from executorch.backends.cortex_m.quantizer.quantizer_support import (
        CORTEX_M_EXPLICIT_LAYOUT_QUANTIZER_SUPPORT_DICT,
    )

    return any(ops[0] == wanted for ops, _ in _names(CORTEX_M_EXPLICIT_LAYOUT_QUANTIZER_SUPPORT_DICT))


FAST_PATH_OPS = ("transformer_encoder_layer_fwd", "native_multi_head_attention")  # leading "_" stripped
FAST_PATH_OFF = ("fix: export with the fast path off: call torch.backends.mha.set_fastpath_enabled(False) "
                 "before torch.export.export")
SDPA = "scaled_dot_product"
UNFUSED = ("fix: write the attention unfused (`q @ k.transpose(-2, -1) * scale`, softmax, `@ v`) "
           "so each op meets its quantizer pattern (for a config target: the unfused-attention remedy)")


def _from_sdpa(node: Node) -> bool:
    """Decomposed from `F.scaled_dot_product_attention` (export records the op it came from)."""
    origins = [str(node.meta.get("original_aten", ""))]
    origins += [str(getattr(n, "target", "")) for n in node.meta.get("from_node") or []]
    return any(SDPA in origin for origin in origins)


def _fused_with(node: Node, wanted: str) -> Node | None:
    """The producer whose pattern `node` would complete (conv2d -> relu), when no pattern starts with it."""
    producer = node.args[0] if node.args else None
    if not isinstance(producer, Node):
        return None
    first = _pattern_op(producer)
    if any(len(ops) > 1 and ops[0] == first and wanted in ops[1:] for ops, _ in _patterns()):
        return producer
    return None


def cause_of(node: Node, as_quantized: Callable[[Node], Node] = lambda n: n) -> Cause:
    """Why `node` is fp32 after lowering, as far as the quantizer's own checks tell.

    The checkers run on the node as the quantizer saw it (`as_quantized`): lowering
    changes layouts (a lowered pool hands on channels_last tensors), the quantizer's
    decision was made before.
    """
    op, wanted = op_name(node), _pattern_op(node)
    if wanted in FAST_PATH_OPS:
        return Cause((op,), "PyTorch's fused inference fast path (nn.TransformerEncoderLayer or nn.MultiheadAttention "
                            "exported under no_grad/inference_mode), one opaque op no CortexMQuantizer pattern covers",
                     FAST_PATH_OFF)
    if _from_sdpa(node):
        return Cause((op,), "part of F.scaled_dot_product_attention, which no CortexMQuantizer pattern covers", UNFUSED)
    checkers = list({checker: None for ops, checker in _patterns() if ops[0] == wanted})
    if not checkers:
        producer = _fused_with(node, wanted)
        if producer is not None:  # its pattern's verdict is the op's
            inner = cause_of(producer, as_quantized)
            return Cause((op,), inner.why, inner.remedy)
        if _explicit_layout_covers(wanted):
            return Cause((op,), "no CortexMQuantizer pattern covers it (only the experimental explicit-layout "
                                "patterns, CortexMQuantizer(use_explicit_layout=True), have one)")
        return Cause((op,), "no CortexMQuantizer pattern covers it")
    refused = []
    for checker in checkers:
        try:
            accepted = checker.check_pattern([as_quantized(node)])
        except Exception:  # a checker written for the quantizer's graph may not read this one
            accepted = True
        if accepted:
            return Cause((op,), f"matches CortexMQuantizer's {wanted} pattern ({checker.__name__}), yet "
                                + _why_not_lowered(node, as_quantized(node)))
        refused.append(checker.__name__)
    needs = [_CHECKERS[name] for name in refused if name in _CHECKERS]
    requirement = f": it needs {needs[0][0]}" if needs else ""
    return Cause(
        (op,), f"CortexMQuantizer's {wanted} pattern refused it ({', '.join(refused)}){requirement}",
        f"fix: {needs[0][1]}" if needs and needs[0][1] else "",
    )


def _why_not_lowered(node: Node, seen: Node) -> str:
    """What the quantized program says about an accepted op: annotated or not."""
    from qlint.graph_view import DEQUANTIZE_OPS, QUANTIZE_OPS, packet

    if seen is node:  # no quantized program to ask (a .pte)
        return "stayed fp32"
    operands = [a for a in seen.args[:2] if isinstance(a, Node)]
    if operands and all(packet(op_name(a)) in DEQUANTIZE_OPS for a in operands) and seen.users and all(
        packet(op_name(u)) in QUANTIZE_OPS for u in seen.users
    ):
        return "the Cortex-M lowering left it in fp32 although the quantizer annotated it"
    return "the quantizer did not annotate it (an operand or a user of it is not quantized)"


def causes(nodes: list[Node], as_quantized: Callable[[Node], Node] = lambda n: n) -> list[Cause]:
    """The causes of these ops, ops with the same cause named together, in graph order."""
    merged: dict[tuple[str, str], list[str]] = {}
    for node in nodes:
        cause = cause_of(node, as_quantized)
        ops = merged.setdefault((cause.why, cause.remedy), [])
        ops.extend(op for op in cause.ops if op not in ops)
    return [Cause(tuple(ops), why, remedy) for (why, remedy), ops in merged.items()]
