"""NPU partitions of a lowered program: the delegate calls in execution order and the CPU work
between and around them.

An op the NPU does not run splits the partition it sits in: the NPU stops, the CPU computes (in
float, after a dequantize, when the op was left float) and the NPU starts again. Which ops split
is a question of the graph alone: an op with a delegate call upstream and one downstream. That
holds whatever the op does: a transpose or a concatenation the CPU runs between two delegate calls
splits them as a convolution would. Before the first call or after the last, data movement is only
data movement, and only compute is a fallback there.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.fx import Node

from qlint.analysis.islands import constant_fp32
from qlint.loading.view import GraphView, Kind, base_name, op_name

_CPU_COMPUTE = (Kind.INT_KERNEL, Kind.FP_COMPUTE)
# `getitem` names one output of the call before it (a delegate call's among them): it runs nothing.
_NOT_RUN = frozenset({"getitem"})


@dataclass(frozen=True)
class Fallback:
    """An op the NPU does not run, that computes on the CPU (or moves data there between two partitions)."""

    node: Node
    float: bool          # it computes in float (else on integers, or it moves data)
    splits: bool         # it reads what a delegate call wrote and a later call reads what it writes
    after: int | None    # the last delegate call before it in execution order (an index), None: before the first


@dataclass(frozen=True)
class Partitions:
    delegates: tuple[Node, ...]     # the delegate calls, in execution order
    fallbacks: tuple[Fallback, ...]  # in graph order

    @property
    def count(self) -> int:
        return len(self.delegates)


def partitions(view: GraphView) -> Partitions:
    """The delegate calls of `view`, every op that computes on the CPU instead, and every data move the
    CPU runs between two delegate calls."""
    delegates = tuple(n for n in view.nodes if view.kind(n) == Kind.DELEGATE)
    calls = frozenset(delegates)
    upstream = _reaching(view, calls, forward=True)
    downstream = _reaching(view, calls, forward=False)
    fallbacks, calls_before = [], 0
    for node in view.nodes:  # the graph's order is the order a `.pte` runs its instructions in
        if node in calls:
            calls_before += 1
        elif on_cpu(view, node) or moves_data(view, node):
            splits = bool(upstream.get(node)) and bool(downstream.get(node))
            if splits or on_cpu(view, node):
                fallbacks.append(Fallback(node, view.op_kind(node) == Kind.FP_COMPUTE or constant_fp32(view, node),
                                          splits, calls_before - 1 if calls_before else None))
    return Partitions(delegates, tuple(fallbacks))


def on_cpu(view: GraphView, node: Node) -> bool:
    """Whether `node` is an op that computes on the CPU (an int kernel or float work; not data movement,
    a quantize or a delegate call)."""
    return node.op == "call_function" and view.op_kind(node) in _CPU_COMPUTE


def moves_data(view: GraphView, node: Node) -> bool:
    """Whether `node` is a data move the CPU runs (a view, permute, concatenation, ...; not `getitem`)."""
    return node.op == "call_function" and view.op_kind(node) == Kind.SHAPE and base_name(op_name(node)) not in _NOT_RUN


def cpu_ops(view: GraphView) -> list[Node]:
    """The ops of `view` that compute on the CPU, an NPU's program or not (QL005 counts them)."""
    return [n for n in view.nodes if on_cpu(view, n)]


def _reaching(view: GraphView, delegates: frozenset[Node], forward: bool) -> dict[Node, set[Node]]:
    """For each node, the delegate calls upstream of it (`forward`) or downstream of it."""
    reached: dict[Node, set[Node]] = {}
    nodes = view.nodes if forward else list(reversed(view.nodes))
    for node in nodes:
        neighbours = node.all_input_nodes if forward else list(node.users)
        found: set[Node] = set()
        for other in neighbours:
            found |= reached.get(other, set())
            if other in delegates:
                found.add(other)
        reached[node] = found
    return reached
