"""Does the lowering keep the values? The lowered program against the quantized program it came from.

A dtype check cannot see a lowering that computes the wrong integers: ExecuTorch 1.5.1 lowers an
int16 `clamp(-1, 1)` to an `aten.clamp` on the int16 integers with the float model's bounds, so
every output is clamped to [-1, 1] *integers*. Both programs are run on the same inputs, the
lowered one with the Cortex-M reference kernels, and compared wherever the lowered program holds
the integers a quantize of the quantized program writes: a node lowered from the op that quantize
reads (export records the op in `from_node`), or from the op before an activation the lowering
fused into its kernel, read with the same qparams. An op several lowered nodes claim (a
decomposition copies its provenance onto every part) is not compared.

Each compared node is judged alone: the lowered graph is run with every tensor the quantized
program also computes replaced, once computed, by the quantized program's value, so a node sees the
inputs the quantized program gives it and a difference is its own, not one it inherited. The kernels
requantize in fixed point where the quantized program rounds floats, so a node may differ by a
quantization step; it diverges when it differs by more than `DIVERGED_STEPS`. The first such node
in graph order is where the lowering changed the values.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch.fx import Interpreter, Node

from qlint.graph.view import (
    QUANTIZE_OPS,
    GraphView,
    Kind,
    base_name,
    folded_qparams,
    graph_arguments,
    literal_qparams,
    op_name,
    output_value,
    packet,
    recorded_bytes,
)
from qlint.io.limits import RUN_BUDGET_BYTES
from qlint.rules.qparams import QParams

# More quantization steps than fixed-point requantization explains. Measured on every program of the
# test store and ExecuTorch's Cortex-M test models (docs/checks.md, "Values"): where the lowering is
# right a node judged alone differs by at most 1 step; where it is wrong, by 7 to thousands.
DIVERGED_STEPS = 2


@dataclass(frozen=True)
class Divergence:
    """The first node of the lowered program whose integers are not the quantized program's."""

    node: Node          # in the lowered program
    reference: Node     # the quantized program's node it was lowered from
    steps: float        # the largest difference, in quantization steps
    lowered: float      # one value where it is largest, dequantized, in the lowered program ...
    expected: float     # ... and in the quantized program
    batch: int          # which input batch showed it


@dataclass(frozen=True)
class _Runnable:
    """A program as the value check runs it: its own graph with its lifted tensors as arguments
    (`graph_arguments`: no unlifting), or, for a signature that does not read so, its unlifted module."""

    graph: Any
    arguments: Callable[[tuple[Any, ...]], list[Any]]

    @classmethod
    def of(cls, program: Any, batch: tuple[Any, ...], module: Callable[[], Any]) -> _Runnable:
        if graph_arguments(program, batch) is not None:
            return cls(program.graph_module, lambda given: graph_arguments(program, given) or [])
        return cls(module(), list)


class _Recording(Interpreter):
    """Runs a program's graph and keeps every node's value."""

    def __init__(self, runnable: _Runnable) -> None:
        super().__init__(runnable.graph, garbage_collect_values=False)
        self.arguments = runnable.arguments

    def values(self, inputs: tuple[Any, ...]) -> dict[str, Any]:
        with torch.no_grad():
            self.run(*self.arguments(inputs))
        return {node.name: value for node, value in self.env.items()}


def _read_as(view: GraphView, node: Node) -> QParams | None:
    """How `node`'s integers read: as the dequantize that reads them does (a pass that decomposes an
    op may leave the op's qparams on a part of it), a quantize's own, or those folded into it."""
    for qp in [view.qparams(u) for u in node.users if view.kind(u) == Kind.DEQUANTIZE]:
        if qp is not None:
            return qp
    return view.qparams(node) if view.kind(node) == Kind.QUANTIZE else folded_qparams(node)


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


# Activations a Cortex-M pass fuses into the kernel before them: the kernel then holds their output.
FUSED_ACTIVATIONS = frozenset({"relu", "relu_", "relu6", "hardtanh", "hardtanh_", "clamp", "clamp_min"})


def _quantize_of(node: Node) -> Node | None:
    """The per-tensor quantize whose integers a lowered node made from `node` holds, in the quantized
    program: `node` itself when it is one, the quantize that reads it, or the one after an activation
    that reads it alone (the lowering fuses it into the kernel). The qparams the lowered node reads
    with must be that quantize's, or the node is not compared (`compared`)."""
    if node.op != "call_function":
        return None
    if packet(op_name(node)) in QUANTIZE_OPS:
        return node
    quantize = next((u for u in node.users if u.op == "call_function" and packet(op_name(u)) in QUANTIZE_OPS
                     and "per_tensor" in op_name(u)), None)
    if quantize is None and len(node.users) == 1:
        [user] = node.users
        if user.op == "call_function" and base_name(op_name(user)) in FUSED_ACTIVATIONS:
            return _quantize_of(user)
    return quantize


def compared(view: GraphView, twins: dict[Node, str]) -> list[tuple[Node, str, QParams]]:
    """The lowered program's nodes whose integers are those of a quantize of the quantized program:
    (node, that quantize's name, its qparams), in graph order. A node is compared only when it reads
    its integers as that quantize writes them."""
    pairs = []
    for node in twins:
        value = output_value(node)
        if not isinstance(value, torch.Tensor) or value.is_floating_point():
            continue
        quantize = _quantize_of(view.as_quantized(node))
        written = literal_qparams(quantize) if quantize is not None else None
        read = _read_as(view, node)
        if quantize is None or written is None or read is None:
            continue
        if (read.zero_point, read.qmin, read.qmax) == (written.zero_point, written.qmin, written.qmax) \
                and math.isclose(read.scale, written.scale, rel_tol=1e-6):
            pairs.append((node, quantize.name, written))
    return pairs


def _steps(lowered: torch.Tensor, reference: torch.Tensor, qparams: QParams) -> torch.Tensor:
    """|lowered - reference| in quantization steps, the reference quantized as the lowering reads it."""
    return (lowered.double() - _as_read(reference, qparams, torch.float64)).abs()


def _as_read(value: torch.Tensor, qparams: QParams, dtype: torch.dtype) -> torch.Tensor:
    """The reference's value as the lowered program holds it: its integers, in `dtype`."""
    if not value.is_floating_point():
        return value.to(dtype)
    return torch.clamp(torch.round(value / qparams.scale) + qparams.zero_point, qparams.qmin, qparams.qmax).to(dtype)


def _float_twins(twins: dict[Node, str]) -> dict[Node, str]:
    """Lowered float nodes and the quantized program's nodes they were lowered from (an fp32 island's ops)."""
    return {node: name for node, name in twins.items()
            if cast(torch.Tensor, output_value(node)).is_floating_point()}


class _Forced(Interpreter):
    """Runs the lowered graph with every tensor the quantized program also computes replaced, once
    computed, by the quantized program's value: each node then sees the inputs the quantized program
    gives it, so a difference is that node's own, not one it inherited (teacher forcing)."""

    def __init__(self, view: GraphView, twins: dict[Node, str], pairs: list[tuple[Node, str, QParams]],
                 runnable: _Runnable) -> None:
        super().__init__(runnable.graph)
        self.arguments = runnable.arguments
        self.reference: dict[str, Any] = {}
        self.pairs = {node.name: (name, qparams) for node, name, qparams in pairs}
        # What each compared quantize reads: where it is not finite (a division by zero) the quantized
        # program saturates and a kernel may give any value; arithmetic that has none is not compared.
        quantizes = {n.name: n for n in view.quantized.graph.nodes} if view.quantized is not None else {}
        self.reads = {name: quantizes[name].args[0].name for name, _ in self.pairs.values()
                      if name in quantizes and isinstance(quantizes[name].args[0], Node)}
        self.twins = {node.name: name for node, name in _float_twins(twins).items()}
        self.diverged: list[tuple[str, torch.Tensor, torch.Tensor, QParams, torch.Tensor]] = []

    def judge(self, batch: tuple[Any, ...], reference: dict[str, Any]) -> None:
        """Run on `batch` against the quantized program's values on it; what diverged is in `diverged`."""
        self.reference, self.diverged = reference, []
        with torch.no_grad():
            self.run(*self.arguments(batch))

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
                    self.diverged.append((n.name, got, want, qparams, steps))
                return _as_read(want, qparams, got.dtype)
        elif n.name in self.twins:
            want = self.reference.get(self.twins[n.name])
            if isinstance(want, torch.Tensor) and want.shape == got.shape and want.dtype == got.dtype:
                return want
        return got


def first_divergence(view: GraphView, batches: Sequence[tuple[Any, ...]]) -> Divergence | None:
    """The first compared node of a lowered program that, given the inputs the quantized program it was
    lowered from (`view.quantized`) gives it, computes integers more than DIVERGED_STEPS from that
    program's on any batch; None when all agree, when either program cannot run on the batches
    (QL007's other checks say why), or when they are too large to run here."""
    if view.quantized is None or not batches:
        return None
    held = sum(recorded_bytes(n) for n in view.nodes) + sum(recorded_bytes(n) for n in view.quantized.graph.nodes)
    if held > RUN_BUDGET_BYTES:  # both programs' values are kept for the whole run
        return None
    twins = _twins(view)
    pairs = compared(view, twins)
    if not pairs:
        return None
    quantized = view.quantized
    reference_run = _Recording(_Runnable.of(quantized, batches[0], quantized.module))
    forced = _Forced(view, twins, pairs, _Runnable.of(view.program, batches[0], lambda: view.module))
    for index, batch in enumerate(batches):
        try:
            forced.judge(batch, reference_run.values(batch))
        except Exception:  # noqa: BLE001 - a program that cannot run is the run check's finding
            return None
        if forced.diverged:
            name, got, want, qp, steps = forced.diverged[0]
            at = int(steps.argmax())
            expected = float(want.reshape(-1)[at])
            if not want.is_floating_point():
                expected = (expected - qp.zero_point) * qp.scale
            node = next(n for n in view.nodes if n.name == name)
            return Divergence(node, view.as_quantized(node), float(steps.max()),
                              (float(got.reshape(-1)[at]) - qp.zero_point) * qp.scale, expected, index)
    return None
