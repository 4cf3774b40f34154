"""The figures budgets and metrics read: of the program `--fix` writes, serialized as ExecuTorch
serializes it.

A budget is about what ships, so a `.pt2` or a target is measured as `--fix` would write it
(folded and verified; the same program when nothing folds). When the fix cannot be made, the
lowered program is measured as it is, and the figures say so. A `.pte` is measured from its own
plan (`qlint.graph.pte`). SRAM is the planned arena (activations and the CMSIS-NN scratch buffers
ExecuTorch plans into it) plus what loading the program takes from the method allocator
(`qlint.graph.memory.method_allocator_bytes`); flash is the `.pte`'s length.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from qlint.fix.apply import FixError, FixResult, Serialized, VerificationError, fix_program, to_pte
from qlint.rules.records import ArtifactStats, Figures, Finding
from qlint.settings.config import Config
from qlint.settings.options import RunOptions

if TYPE_CHECKING:
    from qlint.graph.rules import Linted

AS_FIXED = "as --fix writes it"


def figures(artifact: str, measured: str, checked: list[Finding], stats: ArtifactStats,
            findings: list[Finding], serialized: Serialized | None) -> Figures:
    """One artifact's figures: the check's findings by code, and the measured program's fp32 work and memory."""
    figures = Figures.of(artifact, measured, checked, stats, findings)
    if serialized is not None:
        figures.with_memory(serialized.arena_bytes, serialized.peak.bytes if serialized.peak else None,
                            len(serialized.pte), serialized.method_bytes, serialized.at_peak, serialized.constants)
    return figures


def of_fix(artifact: str, checked: list[Finding], result: FixResult) -> Figures:
    """The figures of a fix that was made (`--fix`, or a target's remedies)."""
    return figures(artifact, AS_FIXED, checked, result.stats, result.findings, result.serialized)


def measure(program: Any, linted: Linted, artifact: str, config: Config, inputs: Sequence[tuple[Any, ...]],
            options: RunOptions) -> Figures:
    """The figures of the program `--fix` would write from this lint (no second lowering), or of the
    lowered program as it is when the fix cannot be made (the reason is in `measured`)."""
    if linted.lowered is None:
        return figures(artifact, "not lowered: no memory plan", linted.findings, linted.stats, linted.findings, None)
    try:
        result = fix_program(program, artifact, config, inputs, options, linted=linted)
        return of_fix(artifact, linted.findings, result)
    except (FixError, VerificationError) as exc:
        why = str(exc).removeprefix("cannot fix: ")
    try:
        serialized = to_pte(linted.lowered, config.root)
    except FixError as exc:
        return figures(artifact, f"not serialized: {exc}", linted.findings, linted.stats, linted.findings, None)
    return figures(artifact, f"as lowered, unfolded (--fix would not write it: {why})", linted.findings,
                   linted.stats, linted.findings, serialized)
