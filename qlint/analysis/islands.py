"""Find fp32 islands, constant subgraphs and requantize pairs on a GraphView.

An island is a maximal connected region of float compute (plus the shape ops
that carry its floats) whose inputs come from dequantize nodes, graph inputs or
constants and whose outputs go to quantize nodes or graph outputs. A constant
subgraph is a connected region of ops no runtime input reaches that does fp32
work: it gives the same value on every inference, yet the device computes it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from torch.fx import Node

from qlint.loading.view import GraphView, Kind, base_name, is_float, numel, op_name


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


def _components(view: GraphView, members: set[Node]) -> list[list[Node]]:
    """The connected groups of `members` (linked through their inputs), each in graph order."""
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
    return list(groups.values())


def _island(nodes: list[Node], compute: list[Node]) -> Island:
    """A group of nodes with the operands it reads from outside and the consumers outside it."""
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
    return Island(nodes, compute, inputs, outputs)


def find_islands(view: GraphView) -> list[Island]:
    members = {
        n for n in view.nodes
        if view.kind(n) == Kind.FP_COMPUTE or (view.kind(n) == Kind.SHAPE and is_float(n))
    }
    islands = []
    for nodes in _components(view, members):
        compute = [n for n in nodes if view.kind(n) == Kind.FP_COMPUTE]
        if compute:  # shape-only regions run on integers after lowering
            islands.append(_island(nodes, compute))
    return islands


def constant_fp32(view: GraphView, node: Node) -> bool:
    """Float work on constants: a computed constant whose value, as the graph's ops compute it, is float
    (what the graph records can differ when a lowering folded a quantize into the op)."""
    value = view.computed(node)
    return view.constant_work(node) and value is not None and value.is_floating_point()


def find_constant_subgraphs(view: GraphView) -> list[Island]:
    """Connected call_functions no runtime input reaches (shape ops, quantize and dequantize included)
    that do fp32 work: the same value on every inference. Values are computed only for graphs whose
    shapes were re-traced (lowered, or a checked `.pte`): the quantized program QL003 falls back on has none."""
    members = {n for n in view.nodes if n.op == "call_function" and view.computed(n) is not None}
    subgraphs = []
    for nodes in _components(view, members):
        if any(constant_fp32(view, n) for n in nodes):
            subgraphs.append(_island(nodes, [n for n in nodes if view.constant_work(n)]))
    return subgraphs


def results(island: Island) -> list[Node]:
    """The members whose values leave the group, in graph order."""
    inside = set(island.nodes)
    return [n for n in island.nodes if any(u not in inside for u in n.users)]


def fp32_numel(view: GraphView, node: Node) -> int:
    """Elements of the float tensor a node materializes (0 for integers); a computed constant by its value."""
    value = view.computed(node)
    if value is not None:
        return value.numel() if value.is_floating_point() else 0
    return numel(node) if is_float(node) else 0


def fp32_by_node(view: GraphView, island: Island) -> dict[Node, int]:
    """The island's nodes with the fp32 elements each materializes: its dequantized inputs and its
    own outputs; the quantize nodes it ends in (their outputs are integers) with none. For a constant
    subgraph: its float members."""
    counts = {n: fp32_numel(view, n) for n in island.inputs if view.kind(n) == Kind.DEQUANTIZE}
    counts.update((n, fp32_numel(view, n)) for n in island.nodes)
    counts.update((n, 0) for n in island.outputs if view.kind(n) == Kind.QUANTIZE)
    return counts


def fp32_elements(view: GraphView, island: Island) -> int:
    """Elements of every fp32 tensor the island materializes, per inference."""
    return sum(fp32_by_node(view, island).values())


def fp32_total(view: GraphView, islands: list[Island], constants: list[Island]) -> int:
    """A program's fp32 elements per inference: its islands', then what its constant subgraphs add
    (a constant's dequantize that an island reads is the island's input too, and counted once)."""
    by_island = [fp32_by_node(view, island) for island in islands]
    counted = {n for counts in by_island for n in counts}
    extra = [c for sub in constants for n, c in fp32_by_node(view, sub).items() if n not in counted]
    return sum(sum(counts.values()) for counts in by_island) + sum(extra)


def requantize_pairs(view: GraphView) -> list[tuple[Node, Node]]:
    """`dequantize -> quantize` with nothing in between, on a runtime value (not a constant)."""
    return [
        (dq, user)
        for dq in view.nodes if view.kind(dq) == Kind.DEQUANTIZE and not view.is_constant(dq)
        for user in dq.users if view.kind(user) == Kind.QUANTIZE
    ]


@dataclass
class Coverage:
    int_ops: int                   # on integers where it counts: the CPU's int kernels, or the NPU's ops
    fp32_op_counts: Counter[str]   # base op name -> how many run in fp32
    cpu_int_ops: int = 0           # with an NPU: the integer ops the CPU runs instead

    @property
    def total(self) -> int:
        return self.int_ops + self.cpu_int_ops + sum(self.fp32_op_counts.values())

    @property
    def ratio(self) -> float:
        return self.int_ops / self.total if self.total else 1.0


def fp32_compute(view: GraphView) -> list[Node]:
    """Every op that computes in float on the device: island ops, and fp32 work on constants."""
    return [n for n in view.nodes if view.kind(n) == Kind.FP_COMPUTE or constant_fp32(view, n)]


def coverage(view: GraphView, npu_ops: int | None = None) -> Coverage:
    """Share of compute ops (no shape, q/dq or planning ops) running as int kernels; with `npu_ops` (the
    ops the program's delegate calls run), the share the NPU runs."""
    int_ops = sum(1 for n in view.nodes if view.kind(n) == Kind.INT_KERNEL)
    fp32 = Counter(base_name(op_name(n)) for n in fp32_compute(view))
    return Coverage(int_ops, fp32) if npu_ops is None else Coverage(npu_ops, fp32, int_ops)
