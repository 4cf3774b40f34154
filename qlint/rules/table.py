"""The rule table: each code, when it runs, the function of each tier, and how its fix applies.

One row per rule, read top to bottom like ruff's `codes.rs`; the rule's documentation (name,
severity, what / why / example / fix safety) is its YAML file in `rules/`, joined to the row by
`qlint.rules.catalog`. Functions are named, not imported, so the table stays torch-free and below
the layers that implement them; they are resolved on first use.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from qlint._compat import StrEnum


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
    code: str
    scope: Scope
    full: str | None      # "module:function" of the full check
    static: str | None    # "module:function" of the static tier (None: the full check only)
    applicability: Applicability
    availability: Availability


_S, _N = Applicability.SAFE, Applicability.NONE
TABLE: tuple[Row, ...] = (
    Row("QL001", Scope.REGION, "qlint.graph.rules:constant_scale", "qlint.static.rules:scale_finding",
        _S, Availability.SOMETIMES),
    # The static tier reports a QL002 only where an island's constant it cannot compute decides between
    # QL001 and QL002 (from `scale_finding`); every other fp32 island needs lowering.
    Row("QL002", Scope.REGION, "qlint.graph.rules:fp32_island", None, _S, Availability.SOMETIMES),
    Row("QL003", Scope.LOWERING, "qlint.graph.rules:lowering_failed", None, _N, Availability.NONE),
    Row("QL004", Scope.REGION, "qlint.graph.rules:requantize", "qlint.static.rules:requantize_findings",
        _S, Availability.SOMETIMES),
    Row("QL005", Scope.PROGRAM, "qlint.graph.rules:low_coverage", None, _N, Availability.NONE),
    Row("QL006", Scope.REPORT, "qlint.report.suppressions:unused_suppressions", None, _N, Availability.NONE),
    # Its fix is the channels-last remedy of a config target (`--unsafe-fixes`), shown as a patch.
    Row("QL007", Scope.PROGRAM, "qlint.graph.rules:lowered_program_invalid", None,
        Applicability.UNSAFE, Availability.SOMETIMES),
    Row("QL008", Scope.REGION, "qlint.graph.rules:constant_subgraph", None, _S, Availability.SOMETIMES),
    Row("QL009", Scope.FIGURES, "qlint.report.budgets:over_budget", None, _N, Availability.NONE),
)


@dataclass(frozen=True)
class Rule:
    """A table row with its catalog entry: everything qlint knows about one code."""

    code: str
    scope: Scope
    full: str | None
    static: str | None
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

    def function(self, tier: str = "full") -> Callable[..., Any]:
        """The function producing the rule's findings in `tier` ("full" or "static")."""
        path = self.full if tier == "full" else self.static
        if path is None:
            raise LookupError(f"{self.code} has no {tier}-tier function")
        return _resolve(path)


@cache
def _resolve(path: str) -> Callable[..., Any]:
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def static_codes() -> tuple[str, ...]:
    """The codes the static tier decides (`qlint check --static`)."""
    return tuple(row.code for row in TABLE if row.static is not None)
