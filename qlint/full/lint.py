"""The one lint driver: a quantized program (a `.pt2`'s or a config target's) lowered for Cortex-M, or
the program a `.pte` ships, read as it is, then the rules. Used by the engine, `--fix` and the API."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

from qlint.records.results import Figures, Report
from qlint.settings.config import Config
from qlint.settings.options import RunOptions

if TYPE_CHECKING:
    from qlint.device.cost import ProgramCost
    from qlint.full.rules import Linted
    from qlint.loading.ethos_u import Delegation
    from qlint.loading.view import GraphView
    from qlint.settings.npus import Npu

Measure: TypeAlias = "Callable[[GraphView, ProgramCost], ProgramCost]"


def lint_program(program: Any, artifact: str, config: Config, options: RunOptions | None = None, *,
                 values_verified: bool = False, measure: Measure | None = None,
                 npu_inputs: Sequence[tuple[Any, ...]] | None = None) -> Linted:
    """Lower one quantized ExportedProgram (for the Cortex-M CPU, or with `config.npu` for its Ethos-U
    as Arm's flow does) and run the enabled rules on the result.

    When lowering raises, the failure becomes a QL003 finding and the rules run
    on the quantized program instead, so the islands are still reported.
    `values_verified`: the caller runs QL007's value check itself (`--fix`, on its inputs).
    `measure`: measured cycles of the lowered program's ops from its view and the estimate (`--profile`).
    `npu_inputs`: what QL007 runs an NPU program's partitions on (`--fix`'s verification inputs).
    """
    from qlint.full.rules import run_rules
    from qlint.loading.lowering import LoweringError, run_passes, to_edge
    from qlint.loading.view import GraphView

    options = options or RunOptions()
    delegation = None
    try:
        if config.npu is not None:
            from qlint.loading import ethos_u

            npu_lowering = ethos_u.lower(program, config.npu)
            lowered, delegation = npu_lowering.program, npu_lowering.delegation
        else:
            edge = to_edge(program)
            lowered = run_passes(edge.exported_program(), config.target_cpu, options.order)
    except LoweringError as exc:
        return run_rules(GraphView(program), artifact, config, failure=exc, verbose=options.verbose)
    view = GraphView(lowered, quantized=program)
    if delegation is not None and config.npu is not None and options.split_costs:
        delegation = _compiled_both_ways(program, view, delegation, config.npu)
    linted = run_rules(view, artifact, config, verbose=options.verbose, values_verified=values_verified,
                       npu_inputs=npu_inputs,
                       measure=None if measure is None else functools.partial(measure, view), delegation=delegation)
    linted.lowered = lowered
    return linted


def _compiled_both_ways(program: Any, view: GraphView, delegation: Delegation, npu: Npu) -> Delegation:
    """`delegation` with each op the quantizer left in float on the CPU compiled the other way too,
    quantized onto the NPU (`ethos_u.with_on_npu`): what a fallback costs is the difference."""
    from qlint.analysis.partitions import partitions
    from qlint.loading import ethos_u

    unquantized = {name for name, found in delegation.rejections.items()
                   if any(r.check == ethos_u.UNQUANTIZED for r in found)}
    left_float = {f.node.name: view.as_quantized(f.node) for f in partitions(view).fallbacks
                  if (f.float or f.splits) and f.node.name in unquantized and view.as_quantized(f.node) is not f.node}
    return ethos_u.with_on_npu(program, npu, delegation, left_float) if left_float else delegation


def lint_pte(data: bytes, artifact: str, config: Config, measure: bool = False, profile: bytes | None = None) -> Report:
    """Run the rules on the program a `.pte` ships (already lowered: nothing to lower); with `measure`,
    its figures for budgets and metrics, from its own plan; with `profile` (an ETDump of this
    `.pte`), cycles as the device measured them."""
    from qlint.device.memory import arena_memory, method_allocator_bytes, peak_contributors
    from qlint.device.profile import measured_cost, read_profile
    from qlint.full.rules import run_rules
    from qlint.loading.pte import read_pte

    shipped = read_pte(data, config.limits)
    measured = read_profile(profile, config.limits) if profile is not None else None
    linted = run_rules(shipped.view, artifact, config, measure=None if measured is None else functools.partial(
        measured_cost, shipped.view, shipped.steps[1:], measured, shipped.name), delegation=shipped.delegation)
    memory = arena_memory(artifact, shipped.buffers, shipped.steps, shipped.arena_bytes)
    report = Report(findings=linted.findings, stats=[linted.stats], memory=[memory] if memory is not None else [])
    if measure:
        figures = Figures.of(artifact, "the .pte as shipped", linted.findings, linted.stats, linted.findings)
        figures.with_flash(len(data), shipped.constants, linted.stats.delegates)
        if memory is not None:
            figures.with_memory(memory.arena_bytes, memory.peak.bytes, len(data), method_allocator_bytes(shipped.plan),
                                peak_contributors(shipped.buffers, memory.peak.step), shipped.constants,
                                linted.stats.delegates)
        report.figures.append(figures)
    return report
