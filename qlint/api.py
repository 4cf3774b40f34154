"""The Python API, as a program calls ruff's or mypy's; the CLI is a thin layer over the same calls.

    from qlint.api import check, lint, fix, remedy
    report = check(["model.pt2"])                       # Report: what `qlint check` prints, as records
    report.findings                                     # list[Finding], suppressions and baseline applied
    findings = lint(quantized_program)                  # list[Finding]
    result = fix(quantized_program, [example_inputs])   # result.pte: bytes, result.findings
    built = remedy(model, example_inputs, calibration, remedies=["channels-last"])
    built.program, built.report, built.pte              # quantized program, figures, verified .pte

Importing this module does not import torch: the stack is loaded when a program is read.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qlint.fix.errors import FixError, VerificationError
from qlint.records.results import (
    ArtifactStats,
    Finding,
    FixSummary,
    InputError,
    Location,
    RemedyReport,
    Report,
    Severity,
)
from qlint.settings.config import Config, RemedyName

if TYPE_CHECKING:
    from qlint.fix.program import FixResult
    from qlint.full.rules import Linted

__all__ = [
    "ArtifactStats", "Config", "Finding", "FixError", "FixResult", "FixSummary", "InputError", "Location",
    "Remedied", "RemedyReport", "Report", "Severity", "VerificationError", "check", "fix", "lint", "remedy",
]


def __getattr__(name: str) -> Any:
    """`FixResult` on first use: it is defined beside the fixing code, which loads the stack."""
    if name == "FixResult":
        from qlint.fix.program import FixResult

        return FixResult
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check(paths: Sequence[str | os.PathLike[str]] = (), config: Config | str | os.PathLike[str] | None = None, *,
          static: bool = False, baseline: str | os.PathLike[str] | None = None,
          base: dict[str, dict[str, Any]] | None = None, jobs: int = 1) -> Report:
    """Check `.pt2` and `.pte` files and folders as `qlint check PATHS` does and return its report: the
    same findings its JSON lists (QL009 over the measured figures with budgets in the config, and
    with `base`, a base run's metrics, their growth limits), `# qlint: ignore` comments applied
    (QL006 for those that silenced nothing), then the findings `baseline` accepts dropped; the
    inputs that cannot be checked are `report.errors`. Without `paths`, the current folder and the
    config's targets. `config`: a `Config`, a `.qlint.yaml` path, or None for the one found upward
    from the current folder. `static`: the static tier, without torch. No result cache is read or
    written. Raises ConfigError (`qlint.settings.config`), ValueError for a board the config cannot
    take, BaselineError (`qlint.run.suppressions`) for a baseline that cannot be read."""
    from qlint.run.check import check as run_check
    from qlint.run.check import for_board, inputs, measures
    from qlint.settings.config import named_or_found
    from qlint.settings.options import RunOptions

    if not isinstance(config, Config):
        config = named_or_found(None if config is None else Path(config))
    config = for_board(config)
    options = RunOptions(static=static, measure=measures(config, base is not None) and not static)
    chosen, targets = inputs([Path(p) for p in paths], config, static=static)
    return run_check(chosen, targets, config, options, baseline=None if baseline is None else Path(baseline),
                     jobs=jobs, base=base)


def lint(program: Any, config: Config | None = None, *, artifact: str = "<program>",
         base: dict[str, dict[str, Any]] | None = None) -> list[Finding]:
    """Lower a quantized ExportedProgram for Cortex-M and return every finding, as `qlint check` does:
    with budgets in the config, the program is measured as `--fix` would write it and held to them
    (QL009), and with `base` (a base run's metrics, `--write metrics:`) to their growth limits."""
    from qlint.full.lint import lint_program

    config = config or Config()
    linted = lint_program(program, artifact, config)
    if not config.budgets.any:
        return linted.findings
    from qlint.fix.measure import measure
    from qlint.full.over_budget import figure_findings
    from qlint.loading.inputs import sample_inputs, verification_inputs
    from qlint.settings.options import RunOptions

    figures = measure(program, linted, artifact, config, verification_inputs(sample_inputs(program)), RunOptions())
    return [*linted.findings, *figure_findings(Report(figures=[figures]), config, base)]


def fix(
    program: Any,
    inputs: Sequence[tuple[Any, ...]] = (),
    config: Config | None = None,
    *,
    artifact: str = "<program>",
    seeds: int | None = None,
    linted: Linted | None = None,
) -> FixResult:
    """Fold what can be folded exactly and return the verified `.pte` bytes.

    `inputs` are batches of example inputs; `seeds` seeded random batches of the
    same shapes are added for verification (None: `qlint.loading.inputs.VERIFY_SEEDS`). `linted`, the program's
    `qlint.full.lint.lint_program` with the same config, saves lowering it again
    (it is left unfolded). Raises FixError or VerificationError; nothing is
    returned half-done.
    """
    from qlint.fix.apply import fix_program
    from qlint.loading.inputs import VERIFY_SEEDS, sample_inputs, verification_inputs

    saved = sample_inputs(program)
    batches = list(inputs) or ([saved] if saved else [])
    verify = verification_inputs(batches[0] if batches else None, batches[1:], VERIFY_SEEDS if seeds is None else seeds)
    return fix_program(program, artifact, config or Config(), verify, linted=linted)


@dataclass
class Remedied:
    """A model built with the remedies that helped, folded and verified."""

    program: Any                     # the quantized ExportedProgram, remedies applied
    example_inputs: tuple[Any, ...]  # in the program's layout (channels_last after that remedy)
    report: RemedyReport             # before -> after per remedy, SQNR included
    fixed: FixResult                 # the folds on top, and the .pte

    @property
    def pte(self) -> bytes:
        """The verified `.pte`; FixError when the fix wrote none (a dry run serializes nothing)."""
        if self.fixed.pte is None:
            raise FixError("cannot fix: the remedied program was not serialized, so it has no .pte")
        return self.fixed.pte


def remedy(
    module: Any,
    example_inputs: tuple[Any, ...],
    calibration_inputs: Sequence[tuple[Any, ...]] = (),
    remedies: Sequence[str] | None = None,
    config: Config | None = None,
    *,
    artifact: str = "<model>",
) -> Remedied:
    """Export and quantize `module` for Cortex-M (with `config.npu`, for its Ethos-U) with each remedy
    that helps, then fold and verify.

    `remedies`: the names to try (None: every remedy of the config's flow). Each is tried alone and
    kept only when it raises int8 coverage or lowers fp32 elements, the arena, its live peak or the
    table folds (on an NPU target also the inference's estimated cycles), with the SQNR against the
    float model at most `config.remedy_max_sqnr_drop_db` lower. Raises FixError (nothing
    built) when the kept remedies together fail or cost more accuracy than that.
    """
    from qlint.loading.quantize import BuildError
    from qlint.remedies.remedy import Build
    from qlint.remedies.search import remediate, remedies_for

    config = config or Config()
    names = list(remedies_for(config)) if remedies is None else [RemedyName(name) for name in remedies]
    try:
        done = remediate(Build(module, tuple(example_inputs), tuple(calibration_inputs)), names, config, artifact)
    except BuildError as exc:  # the plain build does not export, quantize, lower or run
        raise FixError(str(exc)) from None
    if done.error is not None:
        raise FixError(done.error)
    return Remedied(done.program, done.build.example, done.report, done.fixed)
