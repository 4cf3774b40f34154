"""Where a planned activation arena goes: the live peak of ExecuTorch's memory plan.

The arena size (`non_const_buffer_sizes`) depends on how the planner packs
tensors; the live peak, the most bytes that must coexist at one step of the
program, is a floor no plan of the same program can go below. What is live at
that step says whether removing fp32 islands can shrink the arena at all, or
whether something else (fp32 graph inputs, a LayerNorm) sets it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch.fx import GraphModule, Node

from qlint.loading.view import op_name
from qlint.records.results import Buffer, Contributor, LivePeak, MemoryTimeline, PlanMemory
from qlint.records.source import locate, module_name

_ARENA = 1  # mem_id of the planned activation arena; 0 is reserved


def _specs(node: Node) -> Iterable[Any]:
    spec = node.meta.get("spec")
    return spec if isinstance(spec, (list, tuple)) else [spec]


def planned_buffers(graph_module: GraphModule, root: Path | None = None) -> list[Buffer]:
    """Every arena tensor once; a view shares its base's bytes, so unions count it once. With `root`,
    each names the model source line of the op that writes it."""
    seen: dict[int, Buffer] = {}
    for node in graph_module.graph.nodes:
        for spec in _specs(node):
            if id(spec) in seen or getattr(spec, "mem_id", None) != _ARENA or spec.lifetime[0] is None:
                continue
            dtype = str(spec.dtype).removeprefix("torch.")
            op = _writer(node)
            writer = "program input" if node.op == "placeholder" else f"output of {op_name(op)}"
            where = locate(op.meta.get("stack_trace"), root) if root is not None else None
            seen[id(spec)] = Buffer(
                spec.lifetime[0], spec.lifetime[1], spec.mem_offset, spec.allocated_memory,
                spec.dtype == torch.float32, node.op == "placeholder",
                module_name(op) or op.name, f"{dtype} {list(spec.shape)}, {writer}", where,
            )
    return list(seen.values())


def _writer(node: Node) -> Node:
    """The op that writes a planned tensor: in an ExecuTorch program a `memory.alloc` is written by the
    out-variant op that takes it as `out=`."""
    if node.op == "call_function" and "alloc" in getattr(node.target, "__name__", ""):
        return next((u for u in node.users if any(v is node for v in u.kwargs.values())), node)
    return node


def live_at(buffers: Iterable[Buffer], step: int) -> list[Buffer]:
    """The tensors live at a step, largest first: what a user would shrink to lower the peak."""
    return sorted((b for b in buffers if b.start <= step <= b.end and b.size > 0), key=lambda b: (-b.size, b.name))


def _covered(buffers: Iterable[Buffer]) -> int:
    """Bytes of the arena covered by these buffers (aliases overlap; live tensors never do)."""
    total, reach = 0, 0
    for b in sorted(buffers, key=lambda b: b.offset):
        begin, end = max(b.offset, reach), b.offset + b.size
        if end > begin:
            total += end - begin
        reach = max(reach, end)
    return total


def _operator_at(graph_module: GraphModule, step: int) -> Node | None:
    """The first real operator at or after a plan step (steps index graph nodes; allocs are not ops)."""
    nodes = list(graph_module.graph.nodes)
    for node in nodes[step:]:
        if node.op == "call_function" and "alloc" not in getattr(node.target, "__name__", ""):
            return node
    return None


def timeline(buffers: list[Buffer]) -> MemoryTimeline | None:
    """Bytes of the arena live at every step, and how many of them are fp32."""
    if not buffers:
        return None
    steps = max(b.end for b in buffers) + 1
    return MemoryTimeline(_live_bytes(buffers, steps), _live_bytes([b for b in buffers if b.fp32], steps))


def _live_bytes(buffers: list[Buffer], steps: int) -> tuple[int, ...]:
    """`_covered` of the buffers live at each step, by a sweep that adds a buffer where it starts
    and removes it after it ends: O(buffers log buffers + steps), where covering the live ones
    anew at every step costs steps x buffers (minutes for a crafted plan of 50,000 of each)."""
    live = [b for b in buffers if b.start <= b.end and b.size > 0]
    cover = _Coverage([edge for b in live for edge in (b.offset, b.offset + b.size)])
    events = sorted([(b.start, 1, b) for b in live] + [(b.end + 1, -1, b) for b in live], key=lambda e: e[0])
    series, at = [], 0
    for step in range(steps):
        while at < len(events) and events[at][0] <= step:
            _, delta, b = events[at]
            cover.add(b.offset, b.offset + b.size, delta)
            at += 1
        series.append(cover.total)
    return tuple(series)


class _Coverage:
    """How many bytes a changing set of byte ranges covers, overlaps counted once: a segment tree
    over the ranges' edges whose node holds how many ranges cover it whole, and the bytes covered
    below it (the sweep of the area of a union of rectangles)."""

    def __init__(self, edges: list[int]) -> None:
        self.edges = sorted(set(edges))
        self.index = {edge: i for i, edge in enumerate(self.edges)}
        self.leaves = 1
        while self.leaves < len(self.edges):
            self.leaves *= 2
        self.width = [0] * (2 * self.leaves)
        for i in range(len(self.edges) - 1):
            self.width[self.leaves + i] = self.edges[i + 1] - self.edges[i]
        for node in range(self.leaves - 1, 0, -1):
            self.width[node] = self.width[2 * node] + self.width[2 * node + 1]
        self.count = [0] * (2 * self.leaves)
        self.covered = [0] * (2 * self.leaves)

    @property
    def total(self) -> int:
        return self.covered[1]

    def add(self, begin: int, end: int, delta: int) -> None:
        """Cover [begin, end) once more (delta 1) or once less (delta -1)."""
        low, high = self.index[begin] + self.leaves, self.index[end] + self.leaves
        count, pull = self.count, self.pull
        first, last = low >> 1, (high - 1) >> 1
        while low < high:
            if low & 1:
                count[low] += delta
                pull(low)
                low += 1
            if high & 1:
                high -= 1
                count[high] += delta
                pull(high)
            low, high = low >> 1, high >> 1
        for node in (first, last):
            while node:
                pull(node)
                node >>= 1

    def pull(self, node: int) -> None:
        """A node's covered bytes from its count and, when no range covers it whole, its children."""
        covered = self.covered
        if self.count[node]:
            covered[node] = self.width[node]
        elif node >= self.leaves:
            covered[node] = 0
        else:
            covered[node] = covered[2 * node] + covered[2 * node + 1]


def peak_of(buffers: list[Buffer], series: MemoryTimeline, node: str, location: str | None = None) -> LivePeak:
    """The live peak (the first step holding the most bytes) of a timeline; `node` runs there."""
    step = peak_step(series)
    return LivePeak(
        bytes=series.total[step],
        fp32_bytes=series.fp32[step],
        input_bytes=_covered(b for b in buffers if b.input and b.start <= step <= b.end),
        node=node,
        location=location,
        step=step,
    )


def peak_step(series: MemoryTimeline) -> int:
    return series.total.index(max(series.total))


def plan_memory(graph_module: GraphModule, root: Path) -> tuple[MemoryTimeline | None, LivePeak | None]:
    """A lowered program's live bytes at every step and its live peak, with the operator that runs
    there and its source line (the plan's buffers read once for both)."""
    series, peak, _ = plan_with_buffers(graph_module, root)
    return series, peak


def plan_with_buffers(graph_module: GraphModule, root: Path
                      ) -> tuple[MemoryTimeline | None, LivePeak | None, list[Buffer]]:
    """`plan_memory`, and the buffers it was read from (what is live at the peak is in them)."""
    buffers = planned_buffers(graph_module, root)
    series = timeline(buffers)
    if series is None:
        return None, None, buffers
    node = _operator_at(graph_module, peak_step(series))
    where = locate(node.meta.get("stack_trace"), root) if node is not None else None
    peak = peak_of(buffers, series, node.name if node is not None else "<inputs>", str(where) if where else None)
    return series, peak, buffers


def arena_memory(artifact: str, buffers: list[Buffer], steps: list[str], arena_bytes: int) -> PlanMemory | None:
    """The memory plan a `.pte` carries (its arena `buffers`, read by `loading.pte`) as a timeline
    and its live peak, with the instruction that runs there (`steps[i]`, step 0 the inputs)."""
    series = timeline(buffers)
    if series is None:
        return None
    return PlanMemory(artifact, arena_bytes, series, peak_of(buffers, series, steps[peak_step(series)]))


def live_peak(graph_module: GraphModule, root: Path) -> LivePeak | None:
    return plan_memory(graph_module, root)[1]


def _constant_name(node: Node, seen_through: frozenset[str] = frozenset({"dequantize", "permute", "view"})) -> str:
    """A constant as the user's model names it: the module of the op that reads it and the argument it
    fills (`feature_extractor.0.weight`), found through dequantize and layout ops; else its graph name."""
    pending, visited = list(node.users), set()
    while pending:
        user = pending.pop(0)
        if user in visited:
            continue
        visited.add(user)
        if any(word in str(user.target) for word in seen_through):
            pending.extend(user.users)
            continue
        path = module_name(user)
        schema = getattr(user.target, "_schema", None)
        index = next((i for i, a in enumerate(user.args) if a is node or a in visited), None)
        argument = schema.arguments[index].name if schema is not None and index is not None else "constant"
        if path is not None:
            return f"{path}.{argument}"
    return node.name


def constant_contributors(program: Any, root: Path, shown: int = 5) -> tuple[Contributor, ...]:
    """The program's largest constants (what flash holds besides the program's tables), largest first,
    named by the module that reads them."""
    signature = program.graph_signature
    sources = {**signature.inputs_to_parameters, **signature.inputs_to_buffers,
               **signature.inputs_to_lifted_tensor_constants}
    found = []
    for node in program.graph_module.graph.nodes:
        if node.op != "placeholder" or node.name not in sources or not node.users:
            continue  # a constant no op reads is not emitted
        key = sources[node.name]
        value = program.state_dict.get(key, program.constants.get(key))
        if not isinstance(value, torch.Tensor):
            continue
        dtype = str(value.dtype).removeprefix("torch.")
        user = next(iter(node.users), None)
        where = locate(user.meta.get("stack_trace"), root) if user is not None else None
        found.append(Contributor(_constant_name(node), value.numel() * value.element_size(),
                                 f"{dtype} {list(value.shape)}", where))
    return tuple(sorted(found, key=lambda c: (-c.amount, c.name))[:shown])


def peak_contributors(buffers: list[Buffer], step: int, shown: int = 5) -> tuple[Contributor, ...]:
    """The tensors live at the peak step, largest first: what a user shrinks to lower the arena."""
    return tuple(Contributor(b.name, b.size, b.what, b.location) for b in live_at(buffers, step)[:shown])


# The method allocator on a 64-bit host, as executorch 1.5.1's runtime lays it out: pointer size,
# and sizeof(EValue), sizeof(TensorImpl), sizeof(BoxedEvalueList) (printed from its headers). A
# Cortex-M core is 32-bit: its pointers and TensorImpl are smaller and its padding no larger, so the
# host figure bounds the device's from above.
_POINTER, _EVALUE, _TENSOR_IMPL = 8, 16, 64


def method_allocator_bytes(plan: Any) -> int:
    """What `Program::load_method` takes from the method allocator for an execution plan (the
    `executorch_flatbuffer` schema object): the values table, each tensor's strides (and sizes and
    dim order when its shape is dynamic) and TensorImpl, boxed lists, the chains, one kernel and one
    argument list per instruction. Replays `Method::init`'s allocations in order on a bump
    allocator; equal to the bytes ExecuTorch's own runtime hands out, measured on five programs
    (docs/budgets.md). Kernel lookups use the temp allocator when the runner gives one, as
    ExecuTorch's runners do; delegates are not counted (Cortex-M programs have none; an Ethos-U
    `.pte`'s figure leaves out each delegate's runtime state)."""
    used = 0

    def take(size: int, align: int) -> None:
        nonlocal used
        used = -(-used // align) * align + size

    take(_EVALUE * len(plan.values), 8)
    if plan.inputs:
        take(len(plan.inputs), 1)  # which inputs are set
    for value in plan.values:
        kind, val = type(value.val).__name__, value.val
        if kind == "IntList":
            take(_POINTER * len(val.items), _POINTER)
            take(8 * len(val.items), 8)
            take(3 * _POINTER, _POINTER)  # BoxedEvalueList<int64_t>
        elif kind in ("BoolList", "DoubleList", "String"):
            take(2 * _POINTER, _POINTER)  # ArrayRef
        elif kind == "Tensor":
            dim = len(val.sizes)
            if int(val.shape_dynamism) != 0:  # not STATIC: sizes and dim order of its own
                take(4 * dim, 4)
                take(dim, 1)
            take(4 * dim, 4)  # strides
            take(_TENSOR_IMPL, 8)
        elif kind in ("TensorList", "OptionalTensorList"):
            element = _POINTER if kind == "TensorList" else 2 * _POINTER
            take(_POINTER * len(val.items), _POINTER)
            take(element * len(val.items), _POINTER)
            take(3 * _POINTER, _POINTER)
    take(4 * _POINTER * len(plan.chains), _POINTER)  # Chain
    for chain in plan.chains:
        take(_POINTER * len(chain.instructions), _POINTER)  # kernels
        take(2 * _POINTER * len(chain.instructions), _POINTER)  # argument lists
        for instruction in chain.instructions:
            if type(instruction.instr_args).__name__ in ("KernelCall", "DelegateCall"):
                take(_POINTER * len(instruction.instr_args.args), _POINTER)
    return used
