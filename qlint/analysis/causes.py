"""Why an op stayed fp32, decided with ExecuTorch's own CortexMQuantizer pattern checkers.

"The backend does not lower aten.convolution" sends a user the wrong way when
the backend lowers every channels_last conv2d and the quantizer only refused
this one's memory format. So for an fp32 op qlint takes the op the quantizer saw
(lowering decomposes: `F.relu6` reaches the quantizer as `relu6`, `nn.LSTM` as
`lstm`), looks up the patterns that start with it
(`CORTEX_M_QUANTIZER_SUPPORT_DICT`), runs their own checkers on the node as the
quantizer saw it and names each condition that failed (`qlint.analysis.conditions`): no
pattern, a pattern that refused it (the failed conditions with their values, and
the change that meets them or that none does), or a pattern that accepts it (and
what the lowering then required).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch.fx import Node

from qlint.analysis import conditions
from qlint.loading.view import base_name, op_name, output_value
from qlint.records.results import shapes_elided


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


LAYER_NORM_OPS = ("layer_norm", "native_layer_norm")
REBUILD_LAYER_NORM = ("fix: rebuild it from linear, add, mul and an rsqrt table, which have int8 kernels "
                      "(for a config target: the int8-layernorm remedy)")


def normalization(ops: list[str]) -> str:
    """Why normalization `ops` stayed fp32. For a LayerNorm, that no CortexMQuantizer pattern starts
    with it (read from the pinned quantizer: a release that adds one drops this) and how to rebuild it."""
    text = f"data-dependent normalization ({', '.join(ops)})"
    layer_norm = any(base_name(op).lstrip("_") in LAYER_NORM_OPS for op in ops)
    if layer_norm and not any(pattern[0] in LAYER_NORM_OPS for pattern, _ in _patterns()):
        text += f": CortexMQuantizer has no layer_norm pattern, so no Cortex-M kernel runs it; {REBUILD_LAYER_NORM}"
    return text


def _from_sdpa(node: Node) -> bool:
    """Decomposed from `F.scaled_dot_product_attention` (export records the op it came from)."""
    origins = [str(node.meta.get("original_aten", ""))]
    origins += [str(getattr(n, "target", "")) for n in node.meta.get("from_node") or []]
    return any(SDPA in origin for origin in origins)


def _producer(node: Node, through_qdq: bool) -> Node | None:
    """The op feeding `node`; with `through_qdq`, seen through the quantize/dequantize pair the
    quantizer put after that op's own pattern."""
    from qlint.loading.view import DEQUANTIZE_OPS, QUANTIZE_OPS, packet

    producer = node.args[0] if node.args else None
    while through_qdq and isinstance(producer, Node) and packet(op_name(producer)) in QUANTIZE_OPS | DEQUANTIZE_OPS:
        producer = producer.args[0] if producer.args else None
    return producer if isinstance(producer, Node) else None


def _fuses(producer: Node, op: str) -> bool:
    """A pattern starting with the producer's op goes on with `op` (conv2d -> relu)."""
    first = _pattern_op(producer)
    return any(len(ops) > 1 and ops[0] == first and op in ops[1:] for ops, _ in _patterns())


def _fused_with(node: Node, wanted: str) -> Node | None:
    """The producer whose pattern `node` would complete (conv2d -> relu), when no pattern starts with it."""
    producer = _producer(node, through_qdq=False)
    return producer if producer is not None and _fuses(producer, wanted) else None


def cause_of(node: Node, as_quantized: Callable[[Node], Node] = lambda n: n) -> Cause:
    """Why `node` is fp32 after lowering, as far as the quantizer's own checks tell.

    The checks run on the node as the quantizer saw it (`as_quantized`): lowering
    changes layouts (a lowered pool hands on channels_last tensors) and decomposes
    ops, the quantizer's decision was made before.
    """
    op, seen = op_name(node), as_quantized(node)
    wanted = _pattern_op(seen)
    if wanted in FAST_PATH_OPS:
        return Cause((op,), "PyTorch's fused inference fast path (nn.TransformerEncoderLayer or nn.MultiheadAttention "
                            "exported under no_grad/inference_mode), one opaque op no CortexMQuantizer pattern covers",
                     FAST_PATH_OFF)
    if _from_sdpa(node):
        return Cause((op,), "part of F.scaled_dot_product_attention, which no CortexMQuantizer pattern covers", UNFUSED)
    checkers = list({checker: None for ops, checker in _patterns() if ops[0] == wanted})
    if not checkers:
        return _no_pattern(node, seen, op, wanted, as_quantized)
    refused: list[str] = []
    failed: list[conditions.Failed] = []
    for checker in checkers:
        mine = _conditions(checker.__name__, seen)
        if not _refuses(checker, seen, mine):
            return _accepted(node, seen, op, wanted, checker.__name__)
        refused.append(checker.__name__)
        failed.extend(mine or [])
    head = f"CortexMQuantizer's {wanted} pattern refused it ({', '.join(refused)})"
    if not failed:
        return Cause((op,), f"{head}; the condition is not one qlint knows")
    return Cause((op,), f"{head}: {', '.join(str(f) for f in failed)}", conditions.remedy(failed))


def _conditions(checker: str, seen: Node) -> list[conditions.Failed] | None:
    """The failed conditions of a check, or None when qlint has none written for it or cannot read the
    node's arguments as the check's op takes them (a crafted program): then no condition is claimed."""
    found = conditions.PATTERN_CONDITIONS.get(checker)
    if found is None:
        return None
    try:
        return found([seen])
    except (TypeError, ValueError, AttributeError, IndexError, ZeroDivisionError):
        return None


def _refuses(checker: Any, seen: Node, mine: list[conditions.Failed] | None) -> bool:
    """ExecuTorch's own verdict. A checker that cannot read this graph (a `.pte` carries no fake tensors),
    or whose check has side effects (the max pool check tags nodes), answers by qlint's conditions."""
    if checker.__name__ == "CortexMMaxPool2DCheck":
        return bool(mine)
    try:
        return not checker.check_pattern([seen])
    except Exception:
        return bool(mine)


def _accepted(node: Node, seen: Node, op: str, wanted: str, checker: str) -> Cause:
    """A pattern took the op: what the lowering then required, or what the quantized program shows."""
    lowering = conditions.LOWERING_CONDITIONS.get(wanted)
    try:
        failed = lowering(seen) if lowering is not None else []
    except (TypeError, ValueError, AttributeError, IndexError):  # arguments a crafted program mangled
        failed = []
    head = f"matches CortexMQuantizer's {wanted} pattern ({checker}), yet "
    if failed:
        return Cause((op,), head + f"the Cortex-M lowering keeps it in fp32: {', '.join(str(f) for f in failed)}",
                     conditions.remedy(failed))
    return Cause((op,), head + _why_not_lowered(node, seen))


def _no_pattern(node: Node, seen: Node, op: str, wanted: str, as_quantized: Callable[[Node], Node]) -> Cause:
    """No pattern starts with the op: one it completes, an equal form a pattern lists, or none at all."""
    producer = _fused_with(node, wanted)
    if producer is not None:  # its pattern's verdict is the op's
        inner = cause_of(producer, as_quantized)
        return Cause((op,), inner.why, inner.remedy)
    shown = op_name(seen) if base_name(op_name(seen)) != base_name(op) else "it"
    equal = conditions.EQUIVALENT_FORMS.get(wanted)
    if equal is not None and _fusable_after(seen, equal[0]):
        return Cause((op,), f"no CortexMQuantizer pattern lists {shown}", f"fix: {equal[1]}")
    if _explicit_layout_covers(wanted):
        return Cause((op,), f"no CortexMQuantizer pattern covers {shown} (only the experimental explicit-layout "
                            "patterns, CortexMQuantizer(use_explicit_layout=True), have one)", _as_2d(wanted))
    return Cause((op,), f"no CortexMQuantizer pattern covers {shown}")


def _as_2d(wanted: str) -> str:
    """For a 1-D convolution, when a 2-D convolution pattern exists: run it as one, kernel height 1."""
    if wanted != "conv1d" or not any(ops[0] == "conv2d" for ops, _ in _patterns()):
        return ""
    return ("fix: run it as a channels_last conv2d over [N, C, 1, L], which CortexMQuantizer's conv2d pattern takes "
            "(for a config target: the conv1d-as-conv2d remedy, qlint fix --unsafe-fixes)")


def _fusable_after(node: Node, form: str) -> bool:
    """A pattern fuses `form` after the op that feeds `node` in the quantized program."""
    producer = _producer(node, through_qdq=True)
    return producer is not None and _fuses(producer, form)


def _why_not_lowered(node: Node, seen: Node) -> str:
    """What the quantized program says about an accepted op: annotated or not."""
    from qlint.loading.view import DEQUANTIZE_OPS, QUANTIZE_OPS, packet

    if seen is node:  # no quantized program to ask (a .pte)
        return "stayed fp32"
    operands = [a for a in seen.args[:2] if isinstance(a, Node)]
    if operands and all(packet(op_name(a)) in DEQUANTIZE_OPS for a in operands) and seen.users and all(
        packet(op_name(u)) in QUANTIZE_OPS for u in seen.users
    ):
        dtypes = sorted({str(a.args[5]).removeprefix("torch.") for a in operands if len(a.args) > 5})
        widths = f" with {', '.join(dtypes)} activations" if dtypes and dtypes != ["int8"] else ""
        return f"the Cortex-M lowering left it in fp32 although the quantizer annotated it{widths}"
    return "the quantizer did not annotate it (an operand or a user of it is not quantized)"


def causes(nodes: list[Node], as_quantized: Callable[[Node], Node] = lambda n: n) -> list[Cause]:
    """The causes of these ops, ops with one cause named together, in graph order. Causes that differ
    only in shapes (two NCHW convolutions of an island) are one, said with the first op's values."""
    merged: dict[tuple[str, str], tuple[str, list[str]]] = {}
    for node in nodes:
        cause = cause_of(node, as_quantized)
        _, ops = merged.setdefault((shapes_elided(cause.why), cause.remedy), (cause.why, []))
        ops.extend(op for op in cause.ops if op not in ops)
    return [Cause(tuple(ops), why, remedy) for (_, remedy), (why, ops) in merged.items()]
