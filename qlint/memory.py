"""Where a planned activation arena goes: the live peak of ExecuTorch's memory plan.

The arena size (`non_const_buffer_sizes`) depends on how the planner packs
tensors; the live peak, the most bytes that must coexist at one step of the
program, is a floor no plan of the same program can go below. What is live at
that step says whether removing fp32 islands can shrink the arena at all, or
whether something else (fp32 graph inputs, a LayerNorm) sets it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.fx import GraphModule, Node

from qlint.findings import LivePeak, MemoryTimeline
from qlint.source import locate

_ARENA = 1  # mem_id of the planned activation arena; 0 is reserved


@dataclass(frozen=True)
class Buffer:
    """One tensor of the arena: live from step `start` to step `end` (inclusive), at `offset`."""

    start: int
    end: int
    offset: int
    size: int
    fp32: bool
    input: bool


def _specs(node: Node) -> Iterable[Any]:
    spec = node.meta.get("spec")
    return spec if isinstance(spec, (list, tuple)) else [spec]


def planned_buffers(graph_module: GraphModule) -> list[Buffer]:
    """Every arena tensor once; a view shares its base's bytes, so unions count it once."""
    seen: dict[int, Buffer] = {}
    for node in graph_module.graph.nodes:
        for spec in _specs(node):
            if id(spec) in seen or getattr(spec, "mem_id", None) != _ARENA or spec.lifetime[0] is None:
                continue
            seen[id(spec)] = Buffer(
                spec.lifetime[0], spec.lifetime[1], spec.mem_offset, spec.allocated_memory,
                spec.dtype == torch.float32, node.op == "placeholder",
            )
    return list(seen.values())


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
    total, fp32 = [], []
    for step in range(max(b.end for b in buffers) + 1):
        live = [b for b in buffers if b.start <= step <= b.end]
        total.append(_covered(live))
        fp32.append(_covered(b for b in live if b.fp32))
    return MemoryTimeline(tuple(total), tuple(fp32))


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
    buffers = planned_buffers(graph_module)
    series = timeline(buffers)
    if series is None:
        return None, None
    node = _operator_at(graph_module, peak_step(series))
    where = locate(node.meta.get("stack_trace"), root) if node is not None else None
    peak = peak_of(buffers, series, node.name if node is not None else "<inputs>", str(where) if where else None)
    return series, peak


def live_peak(graph_module: GraphModule, root: Path) -> LivePeak | None:
    return plan_memory(graph_module, root)[1]
