"""The figures budgets and metrics read: of the program `--fix` writes, serialized as ExecuTorch
serializes it.

A budget is about what ships, so a `.pt2` or a target is measured as `--fix` would write it
(folded; the same program when nothing folds); a check does not run it (`measure`). When the fix
cannot be made, the
lowered program is measured as it is, and the figures say so. A `.pte` is measured from its own
plan (`qlint.loading.pte`). A program lowered for an Ethos-U is measured as lowered (`--fix` folds
it before partitioning and lowers it again, which a check does not), serialized as `to_executorch`
serializes it. SRAM is the planned arena (activations
and the CMSIS-NN scratch buffers ExecuTorch plans into it) plus what loading the program takes from
the method allocator (`qlint.device.memory.method_allocator_bytes`) plus, with NPU partitions, the
largest partition's Vela scratch; flash is the `.pte`'s length, the partitions' command streams and
weights included.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from qlint.fix.apply import FixError, checked_after, detached, fixable_lint, fold_all
from qlint.fix.program import NO_INPUTS, FixResult, Serialized, to_pte
from qlint.records.results import ArtifactStats, Figures, Finding
from qlint.settings.config import Config
from qlint.settings.options import RunOptions

if TYPE_CHECKING:
    from qlint.full.rules import Linted

AS_FIXED = "as --fix writes it"
# A check measures a program lowered for an NPU as it is: `--fix` folds it in the quantized program
# and lowers it again, which a check does not do.
AS_LOWERED_NPU = "as lowered for the NPU, serialized, unfolded (--fix lowers again to fold; a check does not)"


def figures(artifact: str, measured: str, checked: list[Finding], stats: ArtifactStats,
            findings: list[Finding], serialized: Serialized | None) -> Figures:
    """One artifact's figures: the check's findings by code, and the measured program's fp32 work and memory."""
    figures = Figures.of(artifact, measured, checked, stats, findings)
    if serialized is not None:
        figures.with_memory(serialized.arena_bytes, serialized.peak.bytes if serialized.peak else None,
                            len(serialized.pte), serialized.method_bytes, serialized.at_peak, serialized.constants,
                            stats.delegates)
    return figures


def of_fix(artifact: str, checked: list[Finding], result: FixResult) -> Figures:
    """The figures of a fix that was made (`--fix`, or a target's remedies)."""
    return figures(artifact, AS_FIXED, checked, result.stats, result.findings, result.serialized)


def measure(program: Any, linted: Linted, artifact: str, config: Config, inputs: Sequence[tuple[Any, ...]],
            options: RunOptions) -> Figures:
    """The figures of the program `--fix` would write from this lint (no second lowering), or of the
    lowered program as it is when the fix cannot be made (the reason is in `measured`).

    A check folds a copy and serializes it once; it does not run it. The folds are proven exact on
    every input integer, and `--fix` verifies them end to end before it writes: running the program
    before and after on every verification input is a fix's work, not a measurement's. What `--fix`
    refuses to start (no lowering, a program that cannot run, no inputs to verify on) is measured
    as lowered, with that reason."""
    if linted.lowered is None:
        return figures(artifact, "not lowered: no memory plan", linted.findings, linted.stats, linted.findings, None)
    if config.npu is not None:
        return _as_lowered(linted, artifact, config, AS_LOWERED_NPU)
    try:
        fixed, repairs = fixable_lint(program, artifact, config, options, linted)
        if not inputs:
            raise FixError(NO_INPUTS)
        lowered, folds, evaluations = detached(fixed) if not repairs else (
            fixed.lowered, fixed.folds, fixed.analysis.evaluations)
        fold_all(lowered, folds)
        after, serialized = checked_after(program, lowered, artifact, config, options, evaluations)
        return figures(artifact, AS_FIXED, linted.findings, after.stats, after.findings, serialized)
    except FixError as exc:
        why = str(exc).removeprefix("cannot fix: ")
    return _as_lowered(linted, artifact, config, f"as lowered, unfolded (--fix would not write it: {why})")


def _as_lowered(linted: Linted, artifact: str, config: Config, measured: str) -> Figures:
    """The figures of the lowered program as it is, serialized as ExecuTorch serializes it."""
    try:
        serialized = to_pte(linted.lowered, config.root)
    except FixError as exc:
        return figures(artifact, f"not serialized: {exc}", linted.findings, linted.stats, linted.findings, None)
    return figures(artifact, measured, linted.findings, linted.stats, linted.findings, serialized)
