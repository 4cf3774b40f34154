"""The rule registry: each code maps to the one function that produces its findings.

Rules register themselves with `@rule(code, scope)` where they are written
(`qlint.graph.rules`, `qlint.report.suppressions`); runners ask `enabled_rules` before doing
any work, so a deselected rule costs nothing. Torch-free: the CLI can read it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from qlint._compat import StrEnum

F = TypeVar("F", bound=Callable[..., Any])


class Selection(Protocol):
    """What a run selected: a config, seen from below the settings layer."""

    def enabled(self, code: str) -> bool: ...


class Scope(StrEnum):
    """When a rule runs, which decides what its function is given."""

    LOWERING = "lowering"   # once, when the program does not lower: (context) -> findings
    REGION = "region"       # once per island or requantize pair of its code: (context, region) -> finding
    PROGRAM = "program"     # once per program, after the regions: (context) -> findings
    REPORT = "report"       # once per run, on the finished report (unused suppressions)


@dataclass(frozen=True)
class Rule:
    code: str
    scope: Scope
    function: Callable[..., Any]


RULES: dict[str, Rule] = {}


def rule(code: str, scope: Scope) -> Callable[[F], F]:
    """Register `function` as the producer of `code`'s findings."""

    def register(function: F) -> F:
        if code in RULES:
            raise RuntimeError(f"rule {code} registered twice")
        RULES[code] = Rule(code, scope, function)
        return function

    return register


def enabled_rules(scope: Scope, config: Selection) -> list[Rule]:
    """The registered rules of one scope that the config selects, by code."""
    return [r for code, r in sorted(RULES.items()) if r.scope == scope and config.enabled(code)]
