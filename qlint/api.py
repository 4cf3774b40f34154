"""The Python API for export scripts; the CLI is a thin layer over the same calls.

    from qlint.api import lint, fix, remedy
    findings = lint(quantized_program)                  # list[Finding]
    result = fix(quantized_program, [example_inputs])   # result.pte: bytes, result.findings
    built = remedy(model, example_inputs, calibration, remedies=["channels-last"])
    built.program, built.report, built.pte              # quantized program, figures, verified .pte
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from qlint.fix.apply import FixError, FixResult, VerificationError, verification_inputs
from qlint.graph.readers import VERIFY_SEEDS
from qlint.records.results import Finding, RemedyReport
from qlint.settings.config import Config, RemedyName

if TYPE_CHECKING:
    from qlint.graph.rules import Linted

__all__ = ["Config", "FixError", "FixResult", "Remedied", "VerificationError", "fix", "lint", "remedy"]


def lint(program: Any, config: Config | None = None, *, artifact: str = "<program>",
         base: dict[str, dict[str, Any]] | None = None) -> list[Finding]:
    """Lower a quantized ExportedProgram for Cortex-M and return every finding, as `qlint check` does:
    with budgets in the config, the program is measured as `--fix` would write it and held to them
    (QL009), and with `base` (a base run's metrics, `--write metrics:`) to their growth limits."""
    from qlint.graph.lint import lint_program

    config = config or Config()
    linted = lint_program(program, artifact, config)
    if not config.budgets.any:
        return linted.findings
    from qlint.fix.measure import measure
    from qlint.fix.over_budget import figure_findings
    from qlint.graph.readers import sample_inputs
    from qlint.records.results import Report
    from qlint.settings.options import RunOptions

    figures = measure(program, linted, artifact, config, verification_inputs(sample_inputs(program)), RunOptions())
    return [*linted.findings, *figure_findings(Report(figures=[figures]), config, base)]


def fix(
    program: Any,
    inputs: Sequence[tuple[Any, ...]] = (),
    config: Config | None = None,
    *,
    artifact: str = "<program>",
    seeds: int = VERIFY_SEEDS,
    linted: Linted | None = None,
) -> FixResult:
    """Fold what can be folded exactly and return the verified `.pte` bytes.

    `inputs` are batches of example inputs; `seeds` seeded random batches of the
    same shapes are added for verification. `linted`, the program's
    `qlint.graph.lint.lint_program` with the same config, saves lowering it again
    (it is left unfolded). Raises FixError or VerificationError; nothing is
    returned half-done.
    """
    from qlint.fix.apply import fix_program
    from qlint.graph.readers import sample_inputs

    saved = sample_inputs(program)
    batches = list(inputs) or ([saved] if saved else [])
    return fix_program(
        program, artifact, config or Config(), verification_inputs(batches[0] if batches else None, batches[1:], seeds),
        linted=linted,
    )


@dataclass
class Remedied:
    """A model built with the remedies that helped, folded and verified."""

    program: Any                     # the quantized ExportedProgram, remedies applied
    example_inputs: tuple[Any, ...]  # in the program's layout (channels_last after that remedy)
    report: RemedyReport             # before -> after per remedy, SQNR included
    fixed: FixResult                 # the folds on top, and the .pte

    @property
    def pte(self) -> bytes:
        assert self.fixed.pte is not None
        return self.fixed.pte


def remedy(
    module: Any,
    example_inputs: tuple[Any, ...],
    calibration_inputs: Sequence[tuple[Any, ...]] = (),
    remedies: Sequence[str] = tuple(RemedyName),
    config: Config | None = None,
    *,
    artifact: str = "<model>",
) -> Remedied:
    """Export and quantize `module` for Cortex-M with each remedy that helps, then fold and verify.

    Each remedy is tried alone and kept only when it raises int8 coverage or lowers
    fp32 elements, the arena, its live peak or the table folds, with the SQNR against the float
    model at most `config.remedy_max_sqnr_drop_db` lower. Raises FixError (nothing
    built) when the kept remedies together fail or cost more accuracy than that.
    """
    from qlint.graph.quantize import BuildError
    from qlint.remedies.remedy import Build
    from qlint.remedies.search import remediate

    config = config or Config()
    names = [RemedyName(name) for name in remedies]
    try:
        done = remediate(Build(module, tuple(example_inputs), tuple(calibration_inputs)), names, config, artifact)
    except BuildError as exc:  # the plain build does not export, quantize, lower or run
        raise FixError(str(exc)) from None
    if done.error is not None:
        raise FixError(done.error)
    return Remedied(done.program, done.build.example, done.report, done.fixed)
