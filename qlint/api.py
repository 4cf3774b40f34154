"""The Python API for export scripts; the CLI is a thin layer over the same calls.

    from qlint.api import lint, fix
    findings = lint(quantized_program)                  # list[Finding]
    result = fix(quantized_program, [example_inputs])   # result.pte: bytes, result.findings
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from qlint.config import Config
from qlint.findings import Finding
from qlint.fix import FixError, FixResult, VerificationError, verification_inputs

__all__ = ["Config", "FixError", "FixResult", "VerificationError", "fix", "lint"]


def lint(program: Any, config: Config | None = None, *, artifact: str = "<program>") -> list[Finding]:
    """Lower a quantized ExportedProgram for Cortex-M and return every finding."""
    from qlint.program import lint_program

    return lint_program(program, artifact, config or Config()).findings


def fix(
    program: Any,
    inputs: Sequence[tuple[Any, ...]] = (),
    config: Config | None = None,
    *,
    artifact: str = "<program>",
    seeds: int = 8,
) -> FixResult:
    """Fold what can be folded exactly and return the verified `.pte` bytes.

    `inputs` are batches of example inputs; `seeds` seeded random batches of the
    same shapes are added for verification. Raises FixError or
    VerificationError; nothing is returned half-done.
    """
    from qlint.fix import fix_program
    from qlint.readers import sample_inputs

    saved = sample_inputs(program)
    batches = list(inputs) or ([saved] if saved else [])
    return fix_program(
        program, artifact, config or Config(), verification_inputs(batches[0] if batches else None, batches[1:], seeds)
    )
