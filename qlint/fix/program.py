"""Running, comparing and serializing a program: what both fix flows (the Cortex-M fold in
`qlint.fix.apply`, the NPU's in `qlint.fix.npu`) verify with and write, and what a fix returns."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from qlint.analysis.islands import fp32_compute, requantize_pairs
from qlint.analysis.values import flatten
from qlint.device.memory import constant_contributors, method_allocator_bytes, peak_contributors, plan_with_buffers
from qlint.fix.errors import FixError, VerificationError
from qlint.io.reads import first_line
from qlint.loading.view import GraphView
from qlint.records.results import ArtifactStats, Contributor, Finding, FixSummary, LivePeak, MemoryTimeline

NO_INPUTS = "cannot verify a fix without inputs: the program carries no sample inputs"


def run_program(program: Any, inputs: Sequence[tuple[Any, ...]], module: Any = None) -> list[list[torch.Tensor]]:
    """The outputs of `program` (or of `module`, its unlifted module when the caller has one) on each input."""
    module = module if module is not None else program.module()
    with torch.no_grad():
        return [[o for o in flatten(module(*batch))] for batch in inputs]


def require_same_outputs(before: list[list[torch.Tensor]], after: list[list[torch.Tensor]]) -> None:
    """Raise VerificationError unless every output matches bit for bit."""
    for batch, (b_outs, a_outs) in enumerate(zip(before, after, strict=True)):
        if len(b_outs) != len(a_outs):
            raise VerificationError(f"input {batch}: {len(b_outs)} outputs before, {len(a_outs)} after")
        for index, (b, a) in enumerate(zip(b_outs, a_outs, strict=True)):
            if b.shape != a.shape or b.dtype != a.dtype or not torch.equal(b, a):
                raise VerificationError(f"output {index} differs on verification input {batch}")


@dataclass(frozen=True)
class MemoryPlan:
    """What ExecuTorch's memory planning gives a program: the arena and how it fills."""

    arena_bytes: int  # planned activation memory: sum of non_const_buffer_sizes
    peak: LivePeak | None  # what the plan must hold at once, and where
    timeline: MemoryTimeline | None = None  # live bytes at every step
    at_peak: tuple[Contributor, ...] = ()  # the tensors live at the peak, largest first


@dataclass(frozen=True)
class Serialized(MemoryPlan):
    """A serialized program: its plan, and what only the `.pte` has."""

    pte: bytes = b""
    constants: tuple[Contributor, ...] = ()  # the largest constants, by the module that reads them
    method_bytes: int = 0  # what loading it takes from the method allocator (`method_allocator_bytes`)
    manager: Any = field(default=None, compare=False, repr=False)  # the ExecutorchProgramManager: its ETRecord


def etrecord(program: Any, serialized: Serialized) -> bytes:
    """The ETRecord of a written `.pte` (ExecuTorch's `generate_etrecord`): the edge program before
    `to_executorch` and the map from each instruction to its nodes' debug handles, with which
    ExecuTorch's Inspector ties a profile recorded on the device (ETDump) to the program's nodes."""
    import io

    from executorch.backends.cortex_m.edge_compile_config import cortex_m_edge_compile_config
    from executorch.devtools import generate_etrecord
    from executorch.exir import EdgeProgramManager

    edge = EdgeProgramManager({"forward": copy.deepcopy(program)}, compile_config=cortex_m_edge_compile_config())
    written = io.BytesIO()
    generate_etrecord(written, edge, serialized.manager)
    return written.getvalue()


def _to_executorch(program: Any, which: str, config: Any = None) -> Any:
    """`to_executorch` on a copy (it rewrites in place); FixError naming `which` program when it raises."""
    from executorch.backends.cortex_m.edge_compile_config import cortex_m_edge_compile_config
    from executorch.exir import EdgeProgramManager

    try:
        manager = EdgeProgramManager({"forward": copy.deepcopy(program)}, compile_config=cortex_m_edge_compile_config())
        return manager.to_executorch(config)
    except _Planned:
        raise
    except Exception as exc:
        raise FixError(
            f"to_executorch failed on the {which} program: {type(exc).__name__}: {first_line(exc)}"
        ) from None


def _plan(graph_module: Any, arena_bytes: int, root: Path) -> MemoryPlan:
    timeline, peak, buffers = plan_with_buffers(graph_module, root)
    at_peak = peak_contributors(buffers, peak.step) if peak is not None else ()
    return MemoryPlan(arena_bytes, peak, timeline, at_peak)


def to_pte(program: Any, root: Path, which: str = "lowered") -> Serialized:
    """Serialize a lowered program (a copy) and read its memory plan.

    Raises FixError naming `which` program when ExecuTorch cannot serialize it.
    """
    executorch = _to_executorch(program, which)
    plan_ = executorch.executorch_program.execution_plan[0]
    shipped = executorch.exported_program()
    plan = _plan(shipped.graph_module, int(sum(plan_.non_const_buffer_sizes)), root)
    return Serialized(plan.arena_bytes, plan.peak, plan.timeline, plan.at_peak, pte=executorch.buffer,
                      constants=constant_contributors(shipped, root), method_bytes=method_allocator_bytes(plan_),
                      manager=executorch)


class _Planned(Exception):
    """Ends `to_executorch` once memory is planned, carrying the planned graph."""

    def __init__(self, graph_module: Any) -> None:
        super().__init__("planned")
        self.graph_module = graph_module


def memory_plan(program: Any, root: Path, which: str = "unfixed") -> MemoryPlan:
    """The plan `to_pte` would read, without emitting or serializing: ExecuTorch's own passes and
    memory planning (its default `MemoryPlanningPass`, as `to_pte` runs it), stopped there. What a
    fix's before-figures need; about a quarter of `to_executorch`'s time is the emission it skips."""
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir.passes import MemoryPlanningPass

    class PlanOnly(MemoryPlanningPass):
        def run(self, graph_module: Any, graph_signature: Any = None) -> Any:
            super().run(graph_module, graph_signature)
            raise _Planned(graph_module)

    try:
        _to_executorch(program, which, ExecutorchBackendConfig(memory_planning_pass=PlanOnly()))
    except _Planned as planned:
        sizes = planned.graph_module.meta["non_const_buffer_sizes"]
        return _plan(planned.graph_module, int(sum(sizes)), root)
    raise FixError(f"to_executorch did not plan the {which} program's memory")


def float_op_count(view: GraphView) -> int:
    """Float compute ops (work on constants included), counting each dequantize -> quantize round trip as one."""
    return len(fp32_compute(view)) + len(requantize_pairs(view))


@dataclass
class FixResult:
    summary: FixSummary
    findings: list[Finding]  # what remains after fixing
    stats: ArtifactStats
    pte: bytes | None  # None for a dry run
    program: Any = None  # the folded, lowered ExportedProgram
    serialized: Serialized | None = None  # what was written: its plan, peak and constants


def record_after(summary: FixSummary, view: GraphView, stats: ArtifactStats, before: MemoryPlan,
                 after: Serialized, inputs: Sequence[tuple[Any, ...]]) -> None:
    """The figures of the program a fix wrote (its `view`, `stats` and serialized plan `after`) beside
    the ones `summary` holds of the program before (`before`: its memory plan)."""
    summary.fp32_ops = (summary.fp32_ops[0], float_op_count(view))
    summary.fp32_elements = (summary.fp32_elements[0], stats.fp32_elements)
    summary.cycles = (summary.cycles[0], stats.cycles)
    summary.fp32_cycles = (summary.fp32_cycles[0], stats.fp32_cycles)
    summary.partitions = (summary.partitions[0], stats.partitions)
    summary.activation_bytes = (before.arena_bytes, after.arena_bytes)
    if before.peak and after.peak:
        summary.live_peak_bytes = (before.peak.bytes, after.peak.bytes)
        summary.live_peak, summary.live_peak_before = after.peak, before.peak
    summary.memory = (before.timeline, after.timeline)
    summary.pte_bytes = len(after.pte)
    summary.verified_inputs = len(inputs)
