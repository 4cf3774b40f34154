"""Does the lowering keep the values? The lowered program against the quantized program it came from.

A dtype check cannot see a lowering that computes the wrong integers: ExecuTorch 1.5.1 lowers an
int16 `clamp(-1, 1)` to an `aten.clamp` on the int16 integers with the float model's bounds, so
every output is clamped to [-1, 1] *integers*. Both programs are run on the same inputs, the
lowered one with the Cortex-M reference kernels, and compared wherever the lowered program holds
the integers a quantize of the quantized program writes: a node lowered from the op that quantize
reads (export records the op in `from_node`), read with the same qparams. A node a pass fused with
the float ops after it (an activation) holds their value, not its op's, and is not compared; nor is
an op several lowered nodes claim (a decomposition copies its provenance onto every part).

Each compared node is judged alone: the lowered graph is run with every tensor the quantized
program also computes replaced, once computed, by the quantized program's value, so a node sees the
inputs the quantized program gives it and a difference is its own, not one it inherited. The kernels
requantize in fixed point where the quantized program rounds floats, so a node may differ by a
quantization step; it diverges when it differs by more than `DIVERGED_STEPS`. The first such node
in graph order is where the lowering changed the values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch.fx import Interpreter, Node

from qlint.graph.view import (
    QUANTIZE_OPS,
    GraphView,
    Kind,
    folded_qparams,
    op_name,
    output_value,
    packet,
    recorded_bytes,
)
from qlint.io.limits import RUN_BUDGET_BYTES

# More quantization steps than fixed-point requantization explains. Measured on every program of the
# test store and ExecuTorch's Cortex-M test models (docs/checks.md, "Values"): where the lowering is
# right a node judged alone differs by at most 1 step, and by 4 after a kernel fused with its
# activation (not compared itself); where it is wrong, by 100 to thousands.
DIVERGED_STEPS = 8


@dataclass(frozen=True)
class Divergence:
    """The first node of the lowered program whose integers are not the quantized program's."""

    node: Node          # in the lowered program
    reference: Node     # the quantized program's node it was lowered from
    steps: float        # the largest difference, in quantization steps
    lowered: float      # one value where it is largest, dequantized, in the lowered program ...
    expected: float     # ... and in the quantized program
    batch: int          # which input batch showed it


class _Recording(Interpreter):
    """Runs a graph and keeps every node's value."""

    def __init__(self, module: Any) -> None:
        super().__init__(module, garbage_collect_values=False)

    def values(self, inputs: Sequence[Any]) -> dict[str, Any]:
        with torch.no_grad():
            self.run(*inputs)
        return {node.name: value for node, value in self.env.items()}


def _read_as(view: GraphView, node: Node) -> tuple[float, int, int, int] | None:
    """How `node`'s integers read: as the dequantize that reads them does (a pass that decomposes an
    op may leave the op's qparams on a part of it), a quantize's own, or those folded into it."""
    for qp in [view.qparams(u) for u in node.users if view.kind(u) == Kind.DEQUANTIZE]:
        if qp is not None:
            return qp.scale, qp.zero_point, qp.qmin, qp.qmax
    if view.kind(node) == Kind.QUANTIZE:
        qp = view.qparams(node)
        return (qp.scale, qp.zero_point, qp.qmin, qp.qmax) if qp is not None else None
    folded = folded_qparams(node)
    return (folded.scale, folded.zero_point, folded.qmin, folded.qmax) if folded is not None else None


def _twins(view: GraphView) -> dict[Node, str]:
    """Lowered nodes and the one node of the quantized program each was lowered from. A node
    several lowered nodes claim (a pass that decomposed it copied its provenance onto each part)
    stands for none of them."""
    claimed: dict[str, list[Node]] = {}
    for node in view.nodes:
        if node.op == "call_function" and isinstance(output_value(node), torch.Tensor) \
                and view.source_name(node) is not None:
            claimed.setdefault(view.as_quantized(node).name, []).append(node)
    return {nodes[0]: name for name, nodes in claimed.items() if len(nodes) == 1}


def _quantize_of(node: Node) -> Node | None:
    """The per-tensor quantize that reads `node` in the quantized program (`node` itself when it is one):
    the integers a lowered node made from `node` must hold. None when the quantized program quantizes
    only after more float ops (the lowering fused them into one kernel: its value is not `node`'s)."""
    if node.op != "call_function":
        return None
    if packet(op_name(node)) in QUANTIZE_OPS:
        return node
    return next((u for u in node.users if u.op == "call_function" and packet(op_name(u)) in QUANTIZE_OPS
                 and "per_tensor" in op_name(u)), None)


def _literal(quantize: Node) -> tuple[float, int, int, int] | None:
    args = cast(tuple[Any, ...], quantize.args[1:5])
    if len(args) < 4 or not all(isinstance(a, (int, float)) for a in args):
        return None
    return float(args[0]), int(args[1]), int(args[2]), int(args[3])


def compared(view: GraphView) -> list[tuple[Node, str, tuple[float, int, int, int]]]:
    """The lowered program's nodes whose integers are those of a quantize of the quantized program:
    (node, that quantize's name, its qparams), in graph order. A node is compared only when it reads
    its integers as that quantize writes them."""
    pairs = []
    for node in _twins(view):
        value = output_value(node)
        if not isinstance(value, torch.Tensor) or value.is_floating_point():
            continue
        quantize = _quantize_of(view.as_quantized(node))
        written = _literal(quantize) if quantize is not None else None
        read = _read_as(view, node)
        if quantize is None or written is None or read is None:
            continue
        if read[1:] == written[1:] and math.isclose(read[0], written[0], rel_tol=1e-6):
            pairs.append((node, quantize.name, written))
    return pairs


def _steps(lowered: torch.Tensor, reference: torch.Tensor, qparams: tuple[float, int, int, int]) -> torch.Tensor:
    """|lowered - reference| in quantization steps, the reference quantized as the lowering reads it."""
    return (lowered.double() - _as_read(reference, qparams, torch.float64)).abs()


def _as_read(value: torch.Tensor, qparams: tuple[float, int, int, int], dtype: torch.dtype) -> torch.Tensor:
    """The reference's value as the lowered program holds it: its integers, in `dtype`."""
    if not value.is_floating_point():
        return value.to(dtype)
    scale, zero_point, qmin, qmax = qparams
    return torch.clamp(torch.round(value / scale) + zero_point, qmin, qmax).to(dtype)


def _float_twins(view: GraphView) -> dict[Node, str]:
    """Lowered float nodes and the quantized program's nodes they were lowered from (an fp32 island's ops)."""
    return {node: name for node, name in _twins(view).items()
            if cast(torch.Tensor, output_value(node)).is_floating_point()}


class _Forced(Interpreter):
    """Runs the lowered graph with every tensor the quantized program also computes replaced, once
    computed, by the quantized program's value: each node then sees the inputs the quantized program
    gives it, so a difference is that node's own, not one it inherited (teacher forcing)."""

    def __init__(self, view: GraphView, reference: dict[str, Any]) -> None:
        super().__init__(view.program.module())
        self.reference = reference
        self.pairs = {node.name: (name, qparams) for node, name, qparams in compared(view)}
        # What each compared quantize reads: where it is not finite (a division by zero) the quantized
        # program saturates and a kernel may give any value; arithmetic that has none is not compared.
        quantizes = {n.name: n for n in view.quantized.graph.nodes} if view.quantized is not None else {}
        self.reads = {name: quantizes[name].args[0].name for name, _ in self.pairs.values()
                      if name in quantizes and isinstance(quantizes[name].args[0], Node)}
        self.twins = {node.name: name for node, name in _float_twins(view).items()}
        self.diverged: list[tuple[Node, torch.Tensor, torch.Tensor, tuple[float, int, int, int]]] = []

    def run_node(self, n: Node) -> Any:
        got = super().run_node(n)
        if not isinstance(got, torch.Tensor):
            return got
        if n.name in self.pairs:
            name, qparams = self.pairs[n.name]
            want = self.reference.get(name)
            if isinstance(want, torch.Tensor) and want.shape == got.shape:
                steps = _steps(got, want, qparams)
                read = self.reference.get(self.reads.get(name, ""))
                if isinstance(read, torch.Tensor) and read.shape == steps.shape and read.is_floating_point():
                    steps = torch.where(torch.isfinite(read), steps, 0.0)
                if steps.numel() and float(steps.max()) > DIVERGED_STEPS:
                    self.diverged.append((n, got, want, qparams))
                return _as_read(want, qparams, got.dtype)
        elif n.name in self.twins:
            want = self.reference.get(self.twins[n.name])
            if isinstance(want, torch.Tensor) and want.shape == got.shape and want.dtype == got.dtype:
                return want
        return got


def first_divergence(view: GraphView, quantized: Any, batches: Sequence[tuple[Any, ...]]) -> Divergence | None:
    """The first compared node that, given the inputs the quantized program gives it, computes integers
    more than DIVERGED_STEPS from the quantized program's on any batch; None when all agree, when
    either program cannot run on the batches (QL007's other checks say why), or when they are too
    large to run here."""
    if not compared(view) or not batches or sum(recorded_bytes(n) for n in view.nodes) > RUN_BUDGET_BYTES:
        return None
    reference_run = _Recording(quantized.module())
    for index, batch in enumerate(batches):
        try:
            forced = _Forced(view, reference_run.values(batch))
            with torch.no_grad():
                forced.run(*batch)
        except Exception:  # noqa: BLE001 - a program that cannot run is the run check's finding
            return None
        if forced.diverged:
            node, got, want, (scale, zero_point, _, _) = forced.diverged[0]
            steps = _steps(got, want, forced.pairs[node.name][1])
            at = int(steps.argmax())
            expected = float(want.reshape(-1)[at])
            if not want.is_floating_point():
                expected = (expected - zero_point) * scale
            original = next(n for n in view.nodes if n.name == node.name)
            return Divergence(original, view.as_quantized(original), float(steps.max()),
                              (float(got.reshape(-1)[at]) - zero_point) * scale, expected, index)
    return None
