"""Find fp32 islands and requantize pairs on a GraphView.

An island is a maximal connected region of float compute (plus the shape ops
that carry its floats) whose inputs come from dequantize nodes, graph inputs or
constants and whose outputs go to quantize nodes or graph outputs.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from torch.fx import Node

from qlint.graph_view import GraphView, Kind, base_name, is_float, numel, op_name


@dataclass
class Island:
    nodes: list[Node]       # members in graph order
    compute: list[Node]     # the members that compute (not shape ops)
    inputs: list[Node] = field(default_factory=list)    # operands from outside
    outputs: list[Node] = field(default_factory=list)   # consumers outside

    @property
    def ops(self) -> list[str]:
        return [op_name(n) for n in self.compute]

    @property
    def anchor(self) -> Node:
        """The node a finding points at: the first compute op."""
        return (self.compute or self.nodes)[0]


def find_islands(view: GraphView) -> list[Island]:
    members = {
        n for n in view.nodes
        if view.kind(n) == Kind.FP_COMPUTE or (view.kind(n) == Kind.SHAPE and is_float(n))
    }
    parent: dict[Node, Node] = {n: n for n in members}

    def find(n: Node) -> Node:
        while parent[n] is not n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for node in members:
        for arg in node.all_input_nodes:
            if arg in members:
                parent[find(arg)] = find(node)

    groups: dict[Node, list[Node]] = {}
    for node in view.nodes:  # graph order keeps members topologically sorted
        if node in members:
            groups.setdefault(find(node), []).append(node)

    islands = []
    for nodes in groups.values():
        compute = [n for n in nodes if view.kind(n) == Kind.FP_COMPUTE]
        if not compute:
            continue  # shape-only regions run on integers after lowering
        inside = set(nodes)
        inputs: list[Node] = []
        outputs: list[Node] = []
        for n in nodes:
            for arg in n.all_input_nodes:
                if arg not in inside and arg not in inputs:
                    inputs.append(arg)
            for user in n.users:
                if user not in inside and user not in outputs:
                    outputs.append(user)
        islands.append(Island(nodes, compute, inputs, outputs))
    return islands


def fp32_by_node(view: GraphView, island: Island) -> dict[Node, int]:
    """The island's nodes with the fp32 elements each materializes: its dequantized inputs and its
    own outputs; the quantize nodes it ends in (their outputs are integers) with none."""
    counts = {n: numel(n) for n in island.inputs if view.kind(n) == Kind.DEQUANTIZE}
    counts.update((n, numel(n)) for n in island.nodes)
    counts.update((n, 0) for n in island.outputs if view.kind(n) == Kind.QUANTIZE)
    return counts


def fp32_elements(view: GraphView, island: Island) -> int:
    """Elements of every fp32 tensor the island materializes, per inference."""
    return sum(fp32_by_node(view, island).values())


def requantize_pairs(view: GraphView) -> list[tuple[Node, Node]]:
    """`dequantize -> quantize` with nothing in between, on a runtime value (not a constant)."""
    return [
        (dq, user)
        for dq in view.nodes if view.kind(dq) == Kind.DEQUANTIZE and not view.is_constant(dq)
        for user in dq.users if view.kind(user) == Kind.QUANTIZE
    ]


@dataclass
class Coverage:
    int_ops: int
    fp32_op_counts: Counter[str]   # base op name -> how many run in fp32

    @property
    def total(self) -> int:
        return self.int_ops + sum(self.fp32_op_counts.values())

    @property
    def ratio(self) -> float:
        return self.int_ops / self.total if self.total else 1.0


def coverage(view: GraphView) -> Coverage:
    """Share of compute ops (no shape, q/dq or planning ops) running as int kernels."""
    int_ops = sum(1 for n in view.nodes if view.kind(n) == Kind.INT_KERNEL)
    fp32 = Counter(base_name(op_name(n)) for n in view.nodes if view.kind(n) == Kind.FP_COMPUTE)
    return Coverage(int_ops, fp32)
