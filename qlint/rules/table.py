"""The rule table: each code, when it runs, whether the static tier decides it, and how its fix applies.

One row per rule, read top to bottom like ruff's `codes.rs`; `Code` names every rule, so a code is
spelled here and nowhere else (the type checker knows `Code.CONSTANT_SCALE_ISLAND`, not "QL001").
The rule's documentation (name, severity, what / why / example / fix safety) is its YAML file in
`rules/`, joined to the row by `qlint.rules.catalog`. The functions that produce a rule's findings
live with the layer that can compute them, each tier's in a typed registry keyed by `Code`
(`full.rules.FULL_RULES`, `static.rules.STATIC_RULES`, `run.suppressions.REPORT_RULES`,
`full.over_budget.FIGURE_RULES`); `tests/full/test_rule_registry.py` holds each registry to this table.
"""

from __future__ import annotations

from dataclasses import dataclass

from qlint._compat import StrEnum


class Code(StrEnum):
    """Every rule, by the name its catalog gives it; the value is its code."""

    CONSTANT_SCALE_ISLAND = "QL001"
    FP32_ISLAND = "QL002"
    LOWERING_FAILED = "QL003"
    REQUANTIZE_PAIR = "QL004"
    INT8_COVERAGE = "QL005"
    UNUSED_SUPPRESSION = "QL006"
    LOWERED_PROGRAM_INVALID = "QL007"
    CONSTANT_SUBGRAPH = "QL008"
    OVER_BUDGET = "QL009"
    NPU_FALLBACK = "QL010"


class Scope(StrEnum):
    """When a rule runs, which decides what its function is given."""

    LOWERING = "lowering"   # once, when the program does not lower: (context) -> findings
    REGION = "region"       # once per island or requantize pair of its code: (context, region) -> finding
    PROGRAM = "program"     # once per program, after the regions: (context) -> findings
    REPORT = "report"       # once per run, on the finished report: (config, sources, files, used) -> findings
    FIGURES = "figures"     # once per run, on the measured figures: (report, config, base metrics) -> findings


class Applicability(StrEnum):
    """How far a rule's fix may be trusted (ruff's `Applicability`)."""

    SAFE = "safe"                   # `--fix`: proven exact over the input dtype and end to end
    UNSAFE = "unsafe"               # `--unsafe-fixes`: changes numerics; applied with its SQNR cost measured
    DISPLAY_ONLY = "display-only"   # shown as a patch to the model source, never applied
    NONE = "none"                   # no fix


class Availability(StrEnum):
    """Whether every finding of a rule has the fix (ruff's `FixAvailability`)."""

    ALWAYS = "always"
    SOMETIMES = "sometimes"   # the finding says whether it has one (`fixable`) and why not
    NONE = "none"


@dataclass(frozen=True)
class Row:
    code: Code
    scope: Scope
    static: bool          # the static tier decides it too (`qlint check --static`)
    applicability: Applicability
    availability: Availability


_S, _N = Applicability.SAFE, Applicability.NONE
TABLE: tuple[Row, ...] = (
    Row(Code.CONSTANT_SCALE_ISLAND, Scope.REGION, True, _S, Availability.SOMETIMES),
    # The static tier reports a QL002 only where an island's constant it cannot compute decides between
    # QL001 and QL002, or where a constant's value (zero, not finite) refuses a step (from QL001's
    # function); every other fp32 island needs lowering.
    Row(Code.FP32_ISLAND, Scope.REGION, False, _S, Availability.SOMETIMES),
    Row(Code.LOWERING_FAILED, Scope.LOWERING, False, _N, Availability.NONE),
    Row(Code.REQUANTIZE_PAIR, Scope.REGION, True, _S, Availability.SOMETIMES),
    Row(Code.INT8_COVERAGE, Scope.PROGRAM, False, _N, Availability.NONE),
    Row(Code.UNUSED_SUPPRESSION, Scope.REPORT, False, _N, Availability.NONE),
    # Its fix puts back a quantize the lowering folded away (`qlint.fix.repair`); the NCHW hardswish case
    # has an unsafe one instead, the channels-last remedy of a config target (`--unsafe-fixes`).
    Row(Code.LOWERED_PROGRAM_INVALID, Scope.PROGRAM, False, _S, Availability.SOMETIMES),
    Row(Code.CONSTANT_SUBGRAPH, Scope.REGION, False, _S, Availability.SOMETIMES),
    Row(Code.OVER_BUDGET, Scope.FIGURES, False, _N, Availability.NONE),
    # Its fix: a gather that dequantizes its whole int8 table reads the table instead (`plan_gather`).
    Row(Code.NPU_FALLBACK, Scope.PROGRAM, False, _S, Availability.SOMETIMES),
)


@dataclass(frozen=True)
class Rule:
    """A table row with its catalog entry: everything qlint knows about one code."""

    code: Code
    scope: Scope
    static: bool
    applicability: Applicability
    availability: Availability
    name: str
    default_severity: str
    guards: tuple[str, ...]
    summary: str
    what_it_does: str
    why_it_matters: str
    example: str
    fix_safety: str

    @property
    def fixable(self) -> bool:
        """Whether `--fix` or `--unsafe-fixes` can fix any of its findings."""
        return self.availability != Availability.NONE

    @property
    def fix_text(self) -> str:
        """`safe, sometimes available`, as `qlint rules` and docs/rules.md show it."""
        if self.applicability == Applicability.NONE:
            return "none"
        return f"{self.applicability}, {self.availability} available"


def static_codes() -> tuple[Code, ...]:
    """The codes the static tier decides (`qlint check --static`)."""
    return tuple(row.code for row in TABLE if row.static)


def full_check_codes() -> tuple[Code, ...]:
    """The codes only the full check decides (run-level QL006 aside, which both tiers report)."""
    return tuple(row.code for row in TABLE if not row.static and row.scope != Scope.REPORT)
